"""The MLPerf entry point end to end on the CPU fixture, and its bad-input errors."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from compliance.check import check_log
from compliance.logs import summarize
from tests.compliance import e2e_logs
from tests.entry_points import error_lines, run_program, run_script

REPO = Path(__file__).resolve().parents[3]
SMALL_FLAGS = ["--filters", "2,4,8,8,8", "--input-shape", "64,32,32", "--val-input-shape",
               "64,32,32", "--batch-size", "4", "--workers", "0", "--epochs", "1",
               "--start-eval-at", "1"]


def run(env_extra: dict, timeout: int = 900):
    return run_script("unet3d", env_extra, timeout)


def run_module(data_dir, tmp_path, *flags):
    return run_program("unet3d", "--data-dir", str(data_dir), "--log-file",
                       str(tmp_path / "log.txt"), *SMALL_FLAGS, *flags)


@pytest.mark.slow
def test_tiny_config_reaches_target_and_passes_compliance(tmp_path, kits_fixture):
    proc = run({"CONFIG": "cpu_tiny", "LOGDIR": str(tmp_path), "SEED": "1",
                "FIXTURE_DIR": str(kits_fixture)})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    log = tmp_path / "result_0.txt"
    assert check_log(log).compliant
    e2e_logs.keep("unet3d", log)
    summary = summarize(log)
    assert summary.status == "success" and summary.last_quality >= 0.908
    assert summary.dataset.startswith("fixture")
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT,")]
    assert len(result) == 1 and result[0].split(",")[1:3] == ["unet3d", "1"]
    assert "compliance PASS" in proc.stdout


def _copy(kits_fixture, tmp_path) -> Path:
    data = tmp_path / "kits"
    shutil.copytree(kits_fixture, data)
    return data


def test_shape_mismatch_names_the_case(tmp_path, kits_fixture):
    data = _copy(kits_fixture, tmp_path)
    label = np.load(data / "case_00007_y.npy")
    np.save(data / "case_00007_y.npy", label[:, :-1])
    proc = run_module(data, tmp_path)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "case 00007" in lines[0] and "shape" in lines[0]


def test_label_outside_the_classes_is_an_error(tmp_path, kits_fixture):
    data = _copy(kits_fixture, tmp_path)
    label = np.load(data / "case_00003_y.npy")   # an evaluation case: read at the first evaluation
    label[0, 1, 1, 1] = 3
    np.save(data / "case_00003_y.npy", label)
    proc = run_module(data, tmp_path)
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "case_00003_y.npy" in lines[0] and "[3]" in lines[0]
    assert summarize(tmp_path / "log.txt").status == "aborted"


def test_missing_case_file(tmp_path, kits_fixture):
    data = _copy(kits_fixture, tmp_path)
    (data / "case_00010_y.npy").unlink()
    proc = run({"DATADIR": str(data), "LOGDIR": str(tmp_path),
                "EXTRA_ARGS": " ".join(SMALL_FLAGS)})
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "case_00010_y.npy: missing" in lines[0]


def test_no_evaluation_cases_stop_the_run_before_the_clock(tmp_path, kits_fixture):
    """Today: every evaluation logs mean Dice nan and training goes on."""
    data = tmp_path / "kits"
    data.mkdir()
    for case_id in ("00001", "00002", "00004", "00007"):
        for kind in "xy":
            shutil.copy(kits_fixture / f"case_{case_id}_{kind}.npy", data)
    proc = run_module(data, tmp_path)
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = error_lines(proc)
    assert len(lines) == 1 and f"{data}: none of the reference's 42 evaluation" in lines[0]
    assert "run_start" not in (tmp_path / "log.txt").read_text()


def test_missing_datadir(tmp_path):
    proc = run({"DATADIR": str(tmp_path / "absent"), "LOGDIR": str(tmp_path)})
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and str(tmp_path / "absent") in lines[0]


def test_spatial_group_must_divide_the_ranks(tmp_path, kits_fixture):
    proc = run_module(kits_fixture, tmp_path, "--opt", "spatial-group=2")
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and "spatial-group=2 needs G >= 2 dividing the 1 ranks" in lines[0]


@pytest.mark.slow
def test_spatial_parallel_training_over_two_processes(tmp_path, kits_fixture):
    """run_and_time.sh with GPUS=2 (torchrun, 2 gloo ranks) and spatial-group=2: one sample
    split over the ranks, sharded evaluation (the config's)."""
    proc = run({"CONFIG": "cpu_tiny", "GPUS": "2", "LOGDIR": str(tmp_path), "SEED": "5",
                "FIXTURE_DIR": str(kits_fixture), "OMP_NUM_THREADS": "1",
                "EXTRA_ARGS": " ".join(["--opt", "spatial-group=2", "--lr", "0.1", *SMALL_FLAGS])},
               timeout=600)
    out = proc.stdout
    assert "2 process(es) on cpu" in out and "global batch 4" in out, out + proc.stderr[-2000:]
    assert "training to epoch_num 1: 42 steps" in out and "eval at epoch_num 1: mean_dice" in out
    # 1 is the driver's 'aborted' (one epoch is far from the target), not a crash.
    assert proc.returncode in (0, 1) and "run failed" not in proc.stderr
    assert "RESULT,unet3d,5," in out
    summary = summarize(tmp_path / "result_0.txt")
    assert summary.status in ("success", "aborted") and summary.last_quality is not None
