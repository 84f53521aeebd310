import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.precision import Precision
from common.training import EXIT_ABORTED, EXIT_USER_ERROR, build_parser, main, warm_up
from compliance.check import check_log
from compliance.logs import read_events, summarize
from tests.common.toy_workload import BackgroundToy, DictToy, NestedToy, ToyWorkload, WerToy

REPO = Path(__file__).resolve().parents[2]

REQUIRED = ["cache_clear", "init_start", "submission_benchmark", "submission_org",
            "submission_division", "submission_status", "submission_platform", "seed",
            "dataset", "global_batch_size", "train_samples", "eval_samples", "opt_name",
            "weights_initialization", "init_stop", "run_start", "block_start", "epoch_start",
            "epoch_stop", "eval_start", "eval_accuracy", "eval_stop", "block_stop", "run_stop"]


def run_toy(tmp_path, *flags):
    log = tmp_path / "log.txt"
    code = main(ToyWorkload, ["--device", "cpu", "--precision", "fp32", "--seed", "3",
                              "--log-file", str(log), *flags])
    return code, log


def test_success_logs_every_required_key_in_order(tmp_path):
    code, log = run_toy(tmp_path)
    assert code == 0
    keys = [e["key"] for e in read_events(log)]
    for k in REQUIRED:
        assert k in keys, k
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("block_start")
    assert keys[-1] == "run_stop"
    s = summarize(log)
    assert s.status == "success" and s.seed == 3 and s.seconds > 0
    assert s.dataset.startswith("toy")


def test_each_evaluation_prints_its_samples_time_and_rate(tmp_path, capsys):
    code, log = run_toy(tmp_path)
    lines = re.findall(r"evaluation at epoch_num (\d+): 256 samples, [\d.]+ s, ([\d.]+) "
                       r"samples/s\n", capsys.readouterr().out)
    evals = [e["metadata"]["epoch_num"] for e in read_events(log) if e["key"] == "eval_start"]
    assert code == 0 and evals and [int(n) for n, _ in lines] == evals
    assert all(float(rate) > 0 for _, rate in lines)


def test_epoch_cap_without_target_is_aborted(tmp_path):
    code, log = run_toy(tmp_path, "--epochs", "1", "--target", "1.01")
    assert code == EXIT_ABORTED
    assert summarize(log).status == "aborted"
    blocks = [e for e in read_events(log) if e["key"] == "block_start"]
    assert len(blocks) == 1


def test_exception_still_logs_run_stop_aborted(tmp_path, capsys):
    code, log = run_toy(tmp_path, "--fail-at-epoch", "2", "--target", "1.01")
    assert code == EXIT_ABORTED
    events = read_events(log)
    assert events[-1]["key"] == "run_stop"
    assert events[-1]["metadata"]["status"] == "aborted"
    assert "planted failure" in capsys.readouterr().err


class ClosingToy(ToyWorkload):
    """Records the log's last key each time the driver closes it."""
    closed: list = []

    def close(self):
        ClosingToy.closed.append(read_events(self.args.log_file)[-1]["key"])


@pytest.mark.parametrize("flags", [[], ["--fail-at-epoch", "2", "--target", "1.01"]])
def test_the_workload_is_closed_once_after_run_stop(tmp_path, flags):
    ClosingToy.closed = []
    main(ClosingToy, ["--device", "cpu", "--precision", "fp32", "--seed", "3",
                      "--log-file", str(tmp_path / "log.txt"), *flags])
    assert ClosingToy.closed == ["run_stop"]


def test_bad_precision_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(ToyWorkload, ["--precision", "fp64", "--log-file", str(tmp_path / "x")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp64" in err[0]


def test_bind_cpus_without_a_gpu_is_one_line_error(tmp_path, capsys):
    code, log = run_toy(tmp_path, "--bind-cpus")
    assert code == EXIT_USER_ERROR and not log.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--bind-cpus" in err[0] and "--device cuda" in err[0]


def test_one_line_keeps_worker_user_errors_and_joins_other_messages():
    from common.errors import MAX_CHARS, one_line

    wrapped = RuntimeError("Caught UserError in DataLoader worker process 0.\nTraceback:\n"
                           "  File x\ncommon.errors.UserError: a.JPEG: cannot decode JPEG")
    assert one_line(wrapped) == "a.JPEG: cannot decode JPEG"
    assert one_line(RuntimeError("capture failed\n  detail (x)\n)")) == \
        "capture failed | detail (x) | )"
    assert len(one_line(RuntimeError("y\n" * 1000))) == MAX_CHARS


def test_init_steps_train_before_the_clock_then_restore_weights_and_random_state():
    wl = ToyWorkload(build_parser(ToyWorkload).parse_args([]), DistEnv(), Precision("fp32", "cpu"))
    wl.setup()
    before = [t.clone() for t in wl.training_state()]
    torch.manual_seed(5)
    warm_up(wl, GraphedStep(wl.train_step, enabled=False), 3, DistEnv())
    draw = torch.rand(3)
    assert wl.steps_run == 3
    for a, t in zip(before, wl.training_state()):
        assert torch.equal(a, t)
    torch.manual_seed(5)
    assert torch.equal(draw, torch.rand(3))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_init_steps_keep_their_copy_of_the_training_state_in_host_memory(monkeypatch):
    """The state's copy waits on the host: the device's peak grows by the steps' work, not by
    the state (DLRM's tables are most of its device's memory)."""
    env = DistEnv(device=torch.device("cuda"))
    wl = ToyWorkload(build_parser(ToyWorkload).parse_args([]), env, Precision("fp32", "cuda"))
    wl.setup()
    table = torch.ones(2**26, device="cuda")     # 256 MiB of training state
    state = [*wl.training_state(), table]
    monkeypatch.setattr(wl, "training_state", lambda: state)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    warm_up(wl, GraphedStep(wl.train_step, enabled=False), 2, env)
    assert torch.cuda.max_memory_allocated() - base < 2**26, "the state was copied on the GPU"
    assert torch.equal(table, torch.ones_like(table))


def test_init_steps_run_before_run_start(tmp_path, capsys):
    code, log = run_toy(tmp_path, "--init-steps", "2")
    assert code == 0 and summarize(log).status == "success"
    out = capsys.readouterr().out
    assert "init: 2 warm-up steps on synthetic batches, training state restored" in out


@pytest.mark.parametrize("workload, flags, message", [
    (ToyWorkload, ["--init-steps", "-1"], "must be 0 or more, not -1"),
    (ToyWorkload, ["--log-every", "0"], "must be more than 0, not 0"),
])
def test_bad_init_steps_is_one_line_error(tmp_path, capsys, workload, flags, message):
    try:
        code = main(workload, ["--device", "cpu", "--precision", "fp32",
                               "--log-file", str(tmp_path / "log.txt"), *flags])
    except SystemExit as exc:
        code = exc.code
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def _run(tmp_path, workload, *flags):
    log = tmp_path / "log.txt"
    code = main(workload, ["--device", "cpu", "--precision", "fp32", "--seed", "3",
                           "--log-file", str(log), *flags])
    return code, log, read_events(log)


def _compliant(log):
    verdict = check_log(log)
    assert verdict.compliant, verdict.problems


def test_dict_metric_is_logged_as_a_dict_that_the_real_checker_accepts(tmp_path, capsys):
    code, log, events = _run(tmp_path, DictToy, "--submission-division", "open")
    assert code == 0 and events[-1]["metadata"]["status"] == "success"
    last = [e for e in events if e["key"] == "eval_accuracy"][-1]["value"]
    assert set(last) == {"BBOX", "SEGM"} and last["BBOX"] >= 0.45 and last["SEGM"] >= 0.40
    _compliant(log)
    closing = capsys.readouterr().out.strip().splitlines()[-1]
    assert "BBOX" in closing and "SEGM" in closing and "success" in closing


def test_lower_is_better_target_stops_when_the_error_falls_to_it(tmp_path):
    code, log, events = _run(tmp_path, WerToy, "--submission-division", "open")
    wers = [e["value"] for e in events if e["key"] == "eval_accuracy"]
    assert code == 0 and wers[-1] <= 0.1 and all(w > 0.1 for w in wers[:-1])
    _compliant(log)


def test_background_scoring_trains_on_and_stops_at_the_late_result(tmp_path):
    code, log, events = _run(tmp_path, BackgroundToy, "--background-scoring", "--epochs", "60",
                             "--step-sleep", "0.03", "--log-every", "2", "--score-seconds", "1",
                             "--submission-division", "open")
    assert code == 0 and events[-1]["key"] == "run_stop"
    assert events[-1]["metadata"]["status"] == "success"
    keys = [e["key"] for e in events]
    stop_at = max(i for i, k in enumerate(keys) if k == "eval_accuracy")
    scored = events[stop_at]["metadata"]["epoch_num"]
    started = [e["metadata"]["epoch_num"] for e in events[:stop_at] if e["key"] == "epoch_start"]
    assert max(started) > scored          # training went on while that evaluation was scored
    assert max(started) < 60              # and the late result stopped the run before the cap
    assert keys[stop_at + 1:] == ["run_stop"]
    _compliant(log)


def test_background_scoring_waits_at_the_cap_for_pending_results(tmp_path):
    code, log, events = _run(tmp_path, BackgroundToy, "--background-scoring", "--epochs", "2",
                             "--score-seconds", "0.5", "--submission-division", "open")
    keys = [e["key"] for e in events]
    assert code == 0 and keys.count("eval_accuracy") >= 1
    assert keys.index("eval_accuracy") > max(i for i, k in enumerate(keys) if k == "block_stop")
    _compliant(log)


def test_background_scoring_needs_a_scorer(tmp_path, capsys):
    code, _, _ = _run(tmp_path, ToyWorkload, "--background-scoring")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "no scorer" in err[0]


def test_batches_of_dicts_and_variable_length_tensors(tmp_path):
    code, _, events = _run(tmp_path, NestedToy)
    assert code == 0 and events[-1]["metadata"]["status"] == "success"


def test_non_finite_loss_aborts_at_the_next_read_back(tmp_path, capsys):
    code, log, events = _run(tmp_path, ToyWorkload, "--poison-step", "11", "--log-every", "4",
                             "--target", "1.01")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_ABORTED and events[-1]["metadata"]["status"] == "aborted"
    assert len(err) == 1 and "non-finite" in err[0] and "at step 11 (epoch 2)" in err[0]
    assert [e["key"] for e in events].count("eval_accuracy") == 1   # no evaluation after it


def test_non_finite_loss_read_back_in_a_later_epoch_names_the_epoch_of_its_step(tmp_path,
                                                                                capsys):
    """Step 7 is in epoch 1; the read-back that finds it, at step 10, in epoch 2."""
    code, _, _ = _run(tmp_path, ToyWorkload, "--poison-step", "7", "--log-every", "5",
                      "--eval-every", "2", "--target", "1.01")
    err = capsys.readouterr().err.strip().splitlines()
    assert code == EXIT_ABORTED and len(err) == 1 and "at step 7 (epoch 1)" in err[0], err


def test_non_finite_loss_names_the_epoch_of_its_step_not_of_the_read_back(tmp_path, capsys):
    """A block of two epochs (8 steps each) read back at its end: step 3 is in epoch 1."""
    code, _, _ = _run(tmp_path, ToyWorkload, "--poison-step", "3", "--log-every", "50",
                      "--eval-every", "2", "--target", "1.01")
    err = capsys.readouterr().err
    assert code == EXIT_ABORTED and "at step 3 (epoch 1)" in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_ends_the_run_with_run_stop_aborted(tmp_path, sig):
    log = tmp_path / "log.txt"
    program = ("import sys; from common.training import main; "
               "from tests.common.toy_workload import ToyWorkload; "
               "sys.exit(main(ToyWorkload, sys.argv[1:]))")
    proc = subprocess.Popen([sys.executable, "-c", program, "--device", "cpu", "--precision",
                             "fp32", "--log-file", str(log), "--epochs", "1000", "--target",
                             "1.01", "--step-sleep", "0.01"], cwd=REPO, stderr=subprocess.PIPE,
                            text=True)
    deadline = time.monotonic() + 60
    while not (log.is_file() and "run_start" in log.read_text()):
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.1)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 128 + sig
    last = read_events(log)[-1]
    assert last["key"] == "run_stop" and last["metadata"]["status"] == "aborted"
    assert f"stopped by {sig.name}" in err


@pytest.mark.parametrize("flags, message", [
    (["--synthetic-data", "--data-dir", "x"], "--synthetic-data is for throughput runs"),
    ([], "--data-dir is required"),
])
def test_training_needs_a_dataset_and_refuses_synthetic_data(tmp_path, capsys, flags, message):
    from benchmarks.unet3d.workload import Unet3DWorkload

    with pytest.raises(SystemExit) as e:
        main(Unet3DWorkload, ["--device", "cpu", "--log-file", str(tmp_path / "l"), *flags])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and message in err[0]


def test_a_folder_named_synthetic_is_read_as_a_dataset(tmp_path, capsys, monkeypatch):
    from benchmarks.unet3d.workload import Unet3DWorkload

    (tmp_path / "synthetic").mkdir()
    monkeypatch.chdir(tmp_path)
    code = main(Unet3DWorkload, ["--device", "cpu", "--precision", "fp32", "--data-dir",
                                 "synthetic", "--log-file", str(tmp_path / "log.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "synthetic" in err[0] and "case_" in err[0]


@pytest.mark.parametrize("seed", ["-1", "2147483648", "1.5", "abc"])
def test_seed_outside_0_to_2_31_is_one_line_error(tmp_path, capsys, seed):
    """A negative seed ended in a numpy traceback (RNN-T) after the log began."""
    with pytest.raises(SystemExit) as e:
        main(ToyWorkload, ["--seed", seed, "--log-file", str(tmp_path / "log.txt")])
    err = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(err) == 1 and "--seed" in err[0] and seed in err[0]
    assert not (tmp_path / "log.txt").exists()
