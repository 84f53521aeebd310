import pytest
import torch

from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.precision import Precision
from common.training import EXIT_ABORTED, build_parser, main, warm_up
from compliance.logs import read_events, summarize
from tests.common.toy_workload import ToyWorkload

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


def test_bad_precision_is_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        main(ToyWorkload, ["--precision", "fp64", "--log-file", str(tmp_path / "x")])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp64" in err[0]


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
    wl.build()
    before = [t.clone() for t in wl.training_state()]
    torch.manual_seed(5)
    warm_up(wl, GraphedStep(wl.train_step, enabled=False), 3, DistEnv())
    draw = torch.rand(3)
    assert wl.steps_run == 3
    for a, t in zip(before, wl.training_state()):
        assert torch.equal(a, t)
    torch.manual_seed(5)
    assert torch.equal(draw, torch.rand(3))


def test_init_steps_run_before_run_start(tmp_path, capsys):
    code, log = run_toy(tmp_path, "--init-steps", "2")
    assert code == 0 and summarize(log).status == "success"
    out = capsys.readouterr().out
    assert "init: 2 warm-up steps on synthetic batches, training state restored" in out


@pytest.mark.parametrize("workload, flags, message", [
    (ToyWorkload, ["--init-steps", "-1"], "must be 0 or more, not -1"),
    (ToyWorkload, ["--log-every", "0"], "must be 1 or more, not 0"),
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
