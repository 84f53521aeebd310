from common.training import main
from compliance import check
from compliance.result import main as result_main
from tests.common.toy_workload import ToyWorkload
from tests.compliance import handmade_logs
from tests.compliance.handmade_logs import event


def test_verdict_line_and_exit_code_on_a_failing_log(tmp_path, capsys):
    log = tmp_path / "toy.txt"
    assert main(ToyWorkload, ["--device", "cpu", "--precision", "fp32", "--seed", "1",
                              "--log-file", str(log)]) == 0
    capsys.readouterr()
    # "toy" is no MLPerf benchmark: the real checker must reject the log
    verdict = check.check_log(log)
    assert not verdict.compliant
    assert verdict.problems
    assert check.main([str(log)]) == 1
    out = capsys.readouterr().out.strip().splitlines()
    assert out == [verdict.line()] and out[0].startswith("compliance FAIL: ")


def test_each_log_is_checked_on_its_own(tmp_path, capsys):
    """A log that stops the checker midway leaves none of its rules to the next log."""
    # Closed ResNet with SGD whose evaluation logged no number: the 1.1.0 rules raise on the
    # value with closed_resnet_sgd.yaml still queued in the checker's module-level list.
    bad = handmade_logs.write(tmp_path / "bad.txt", [
        event("submission_division", "closed"), event("submission_benchmark", "resnet"),
        event("opt_name", "sgd"), event("eval_accuracy", None, epoch_num=1)])
    good = handmade_logs.write(tmp_path / "good.txt", handmade_logs.open_run())
    assert check.main([str(good)]) == 0
    capsys.readouterr()
    assert check.main([str(bad), str(good), str(bad), str(good)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 4
    assert out[0].startswith(f"compliance FAIL: {bad} ") and out[2] == out[0]
    assert out[1] == out[3] == f"compliance PASS: {good} (training 1.1.0)"


def test_missing_log_is_bad_input(tmp_path, capsys):
    assert check.main([str(tmp_path / "nope.txt")]) == 2
    assert "no such log file" in capsys.readouterr().err


def test_result_line(tmp_path, capsys):
    log = tmp_path / "toy.txt"
    main(ToyWorkload, ["--device", "cpu", "--precision", "fp32", "--seed", "5",
                       "--log-file", str(log)])
    capsys.readouterr()
    assert result_main([str(log)]) == 0
    line = capsys.readouterr().out.strip()
    fields = line.split(",")
    assert fields[:3] == ["RESULT", "toy", "5"] and float(fields[3]) > 0
    assert fields[4] == "success" and fields[5].startswith("toy")
