from common.training import main
from compliance import check
from compliance.result import main as result_main
from tests.common.toy_workload import ToyWorkload


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
