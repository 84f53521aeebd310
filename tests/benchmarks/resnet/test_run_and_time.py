"""The MLPerf entry point end to end on the CPU, and its bad-input errors."""

import shutil

import pytest

from benchmarks.resnet.fixture import write_fixture
from compliance.check import check_log
from compliance.logs import summarize
from tests.compliance import e2e_logs
from tests.entry_points import error_lines, run_program, run_script

# Small enough for seconds-long runs of the real model; used by the failure cases.
SMALL = dict(num_classes=4, train_per_class=8, val_per_class=4, image_size=40)
SMALL_FLAGS = ["--image-size", "32", "--batch-size", "8", "--eval-batch-size", "16",
               "--workers", "0"]


def run(env_extra: dict, timeout: int = 1200):
    return run_script("resnet", env_extra, timeout)


def run_module(*flags):
    return run_program("resnet", *flags)


@pytest.fixture(scope="module")
def small_fixture(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("small") / "imagenet", **SMALL)


@pytest.mark.slow
def test_tiny_config_reaches_target_and_passes_compliance(tmp_path):
    proc = run({"CONFIG": "cpu_tiny", "LOGDIR": str(tmp_path), "SEED": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = tmp_path / "result_0.txt"
    assert check_log(log).compliant
    summary = summarize(log)
    assert summary.status == "success" and summary.last_quality >= 0.759
    assert summary.dataset.startswith("fixture")
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT,")]
    assert len(result) == 1
    fields = result[0].split(",")
    assert fields[1:3] == ["resnet", "1"] and fields[4] == "success"
    assert "fixture" in fields[5]
    assert "compliance PASS" in proc.stdout
    e2e_logs.keep("resnet", log)


def test_unknown_config(tmp_path):
    proc = run({"CONFIG": "no_such_system", "LOGDIR": str(tmp_path)})
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "unknown CONFIG=no_such_system" in lines[0]
    assert "cpu_tiny" in lines[0]


def test_missing_datadir(tmp_path):
    proc = run({"DATADIR": str(tmp_path / "absent"), "LOGDIR": str(tmp_path)})
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and str(tmp_path / "absent") in lines[0]


def test_empty_datadir(tmp_path):
    (tmp_path / "empty").mkdir()
    proc = run({"DATADIR": str(tmp_path / "empty"), "LOGDIR": str(tmp_path)})
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "empty" in lines[0]


def test_invalid_precision(tmp_path, small_fixture):
    proc = run({"DATADIR": str(small_fixture), "LOGDIR": str(tmp_path), "PRECISION": "fp64"})
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "fp64" in lines[0]


def test_class_mismatch_between_train_and_val(tmp_path, small_fixture):
    data = tmp_path / "mismatch"
    shutil.copytree(small_fixture, data)
    extra = sorted((data / "val").iterdir())[0]
    shutil.copytree(extra, data / "val" / "n99999999")
    proc = run_module("--data-dir", str(data), "--log-file", str(tmp_path / "log.txt"),
                      *SMALL_FLAGS)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "n99999999" in lines[0]


def test_corrupt_jpeg_names_the_file(tmp_path, small_fixture):
    data = tmp_path / "corrupt"
    shutil.copytree(small_fixture, data)
    victim = sorted((data / "train").glob("*/*.JPEG"))[0]
    victim.write_bytes(b"\xff\xd8 this is not a jpeg")
    proc = run_module("--data-dir", str(data), "--log-file", str(tmp_path / "log.txt"),
                      *SMALL_FLAGS)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and str(victim) in lines[0]
    assert summarize(tmp_path / "log.txt").status == "aborted"


def test_epoch_cap_without_target_aborts(tmp_path, small_fixture):
    flags = " ".join(SMALL_FLAGS + ["--epochs", "1", "--warmup-epochs", "0", "--lr", "0"])
    proc = run({"DATADIR": str(small_fixture), "LOGDIR": str(tmp_path), "SEED": "3",
                "EXTRA_ARGS": flags})
    assert proc.returncode != 0
    assert "run_stop: aborted" in proc.stdout
    assert "RESULT,resnet,3," in proc.stdout and ",aborted," in proc.stdout
    assert summarize(tmp_path / "result_0.txt").status == "aborted"
