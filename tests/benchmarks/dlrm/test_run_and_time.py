"""The DLRM entry point end to end on the CPU fixture, and its bad-input errors."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.dlrm import data
from benchmarks.dlrm.fixture import write_fixture
from compliance.check import check_log
from compliance.logs import summarize
from tests.compliance import e2e_logs
from tests.entry_points import error_lines, run_program, run_script

SMALL_FLAGS = ["--batch-size", "256", "--eval-batch-size", "1000", "--embedding-dim", "8",
               "--arch-mlp-bot", "13-16-16-8", "--arch-mlp-top", "16-16-16-16-1",
               "--eval-every", "0.5"]


def run(env_extra: dict, timeout: int = 600):
    return run_script("dlrm", env_extra, timeout)


def run_module(data_dir, tmp_path, *flags):
    return run_program("dlrm", "--data-dir", str(data_dir), "--log-file",
                       str(tmp_path / "log.txt"), *SMALL_FLAGS, *flags)


@pytest.fixture(scope="module")
def small_fixture(tmp_path_factory):
    return write_fixture(tmp_path_factory.mktemp("small") / "criteo", train=4000, eval=1000,
                         max_table=50)


def _check_success(proc, log: Path, seed: str):
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert check_log(log).compliant
    summary = summarize(log)
    assert summary.status == "success" and summary.last_quality >= 0.8025
    assert summary.dataset.startswith("fixture")
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT,")]
    assert len(result) == 1 and result[0].split(",")[1:3] == ["dlrm", seed]
    assert "compliance PASS" in proc.stdout


@pytest.mark.slow
def test_tiny_config_reaches_target_and_passes_compliance(tmp_path):
    proc = run({"CONFIG": "cpu_tiny", "LOGDIR": str(tmp_path), "SEED": "1"})
    _check_success(proc, tmp_path / "result_0.txt", "1")
    e2e_logs.keep("dlrm", tmp_path / "result_0.txt")
    text = (tmp_path / "result_0.txt").read_text()
    # 1 plus the fraction of an epoch trained, as the reference logs it and the RCPs count
    assert '"epoch_num": 1.05' in text or '"epoch_num": 1.049' in text


@pytest.mark.slow
def test_tiny_config_on_two_gloo_processes(tmp_path):
    proc = run({"CONFIG": "cpu_tiny", "GPUS": "2", "LOGDIR": str(tmp_path), "SEED": "2",
                "OMP_NUM_THREADS": "1"})
    _check_success(proc, tmp_path / "result_0.txt", "2")
    assert "sharded over 2 rank(s)" in proc.stdout + proc.stderr


def test_truncated_train_file(tmp_path, small_fixture):
    bad = tmp_path / "bad"
    shutil.copytree(small_fixture, bad)
    path = bad / data.TRAIN_FILE
    path.write_bytes(path.read_bytes()[:-100])
    proc = run_module(bad, tmp_path)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1
    assert str(path) in lines[0] and "truncated" in lines[0] and "record 3999" in lines[0]


def test_category_beyond_table_size(tmp_path, small_fixture):
    bad = tmp_path / "bad"
    shutil.copytree(small_fixture, bad)
    path = bad / data.EVAL_FILE
    records = np.fromfile(path, dtype="<i4").reshape(-1, data.RECORD_INTS)
    records[17, 1 + data.NUM_DENSE + 3] = 10_000
    records.tofile(path)
    proc = run_module(bad, tmp_path)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1
    assert str(path) in lines[0] and "record 17" in lines[0] and "10000" in lines[0]
    assert summarize(tmp_path / "log.txt").status == "aborted"


def test_feature_count_mismatch(tmp_path, small_fixture):
    bad = tmp_path / "bad"
    shutil.copytree(small_fixture, bad)
    np.savez(bad / data.COUNTS_FILE, counts=np.full(25, 50))
    proc = run_module(bad, tmp_path)
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1
    assert data.COUNTS_FILE in lines[0] and "25 entries, expected 26" in lines[0]


def test_missing_datadir(tmp_path):
    proc = run({"DATADIR": str(tmp_path / "absent"), "LOGDIR": str(tmp_path)})
    assert proc.returncode == 2
    lines = error_lines(proc)
    assert len(lines) == 1 and str(tmp_path / "absent") in lines[0]


def test_epoch_cap_without_target_aborts(tmp_path, small_fixture):
    proc = run({"DATADIR": str(small_fixture), "LOGDIR": str(tmp_path), "SEED": "3",
                "EXTRA_ARGS": " ".join(SMALL_FLAGS + ["--lr", "0"])})
    assert proc.returncode != 0
    assert "run_stop: aborted" in proc.stdout and ",aborted," in proc.stdout
    assert summarize(tmp_path / "result_0.txt").status == "aborted"


def _workload(data_dir, device: str, *flags):
    from benchmarks.dlrm.workload import DLRMWorkload
    from common.dist import DistEnv
    from common.precision import Precision
    from common.training import build_parser

    args = build_parser(DLRMWorkload).parse_args(
        ["--data-dir", str(data_dir), *SMALL_FLAGS, "--device", device, "--seed", "1",
         "--precision", "fp32", "--max-ind-range", "50", *flags])
    wl = DLRMWorkload(args, DistEnv(device=torch.device(device)), Precision("fp32", device))
    torch.manual_seed(1)   # as the driver seeds it: the MLPs' initial weights
    wl.setup()
    return wl


@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
def test_prefetched_batches_equal_the_batches_read_in_place(small_fixture, device):
    """The prefetch thread (on CUDA: its own copy stream, joined by the consumer's) gives
    the batches ``prepare`` reads directly, in order, while steps run between them."""
    from benchmarks.dlrm.workload import _tensors
    from common.streams import work_stream

    with work_stream(torch.device(device)):
        wl = _workload(small_fixture, device, "--opt", "prefetch")
        epoch = wl.epoch_batches(1)
        seen = 0
        for batch, r in zip(epoch, epoch.ranges):
            wl.train_step(*batch)   # device work between the batches, as in training
            want = wl.prepare(*r)
            for got, exp in zip(_tensors(batch), _tensors(want), strict=True):
                assert torch.equal(got, exp)
            seen += 1
    assert seen == len(epoch) > 2


@pytest.mark.parametrize("others", [[], ["--opt", "fused-sgd,hybrid-embeddings=2"]])
def test_cached_evaluation_equals_the_evaluation_read_afresh(small_fixture, others):
    """cache-eval: later evaluations read nothing and score what an uncached one does, which
    keeps no batch."""
    plain = _workload(small_fixture, "cpu", *others)
    cached = _workload(small_fixture, "cpu", *others, "--opt", "cache-eval")
    want = [plain.evaluate()["auc"], plain.evaluate()["auc"]]
    got = [cached.evaluate()["auc"]]
    cached.prepare_host = None   # a second read would fail
    got.append(cached.evaluate()["auc"])
    assert got == want and 0 < want[0] < 1
    assert plain._eval_cache is None
    assert all(ids.dtype == torch.int32 for _, _, (_, _, ids) in cached._eval_cache)
