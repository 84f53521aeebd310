"""compliance.result: the RESULT line's quality field, and logs that give no time to train."""

import pytest

from compliance.result import main
from tests.compliance.handmade_logs import event, open_run, write


def result_line(tmp_path, events, capsys, *args, rc=0) -> str:
    log = write(tmp_path / "result_0.txt", events)
    assert main([*args, str(log)]) == rc
    (line,) = capsys.readouterr().out.splitlines()
    return line


def test_the_last_accuracy_ends_the_line(tmp_path, capsys):
    events = open_run(accuracy=0.7612)
    events.insert(-2, event("eval_accuracy", 0.5, t=101, epoch_num=1))   # an earlier one
    line = result_line(tmp_path, events, capsys)
    assert line == "RESULT,resnet,42,4.900,success,fixture: handmade,eval_accuracy=0.7612"


@pytest.mark.parametrize("value, field", [
    ({"BBOX": 0.38, "SEGM": 0.34}, "BBOX=0.38;SEGM=0.34"),
    ({"SEGM": 0.341, "BBOX": 0.377}, "SEGM=0.341;BBOX=0.377"),   # the log's key order
])
def test_a_dict_accuracy_is_one_field(tmp_path, capsys, value, field):
    line = result_line(tmp_path, open_run("maskrcnn", value), capsys)
    assert line.split(",") == ["RESULT", "maskrcnn", "42", "4.900", "success",
                               "fixture: handmade", field]


def test_no_accuracy(tmp_path, capsys):
    events = [e for e in open_run() if e["key"] != "eval_accuracy"]
    assert result_line(tmp_path, events, capsys).endswith(",fixture: handmade,eval_accuracy=none")


def test_run_stop_before_run_start_is_refused(tmp_path, capsys):
    log = write(tmp_path / "result_0.txt", open_run(start_ms=5000, stop_ms=4000))
    assert main([str(log)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    (line,) = captured.err.splitlines()
    assert line.startswith(f"error: {log}: run_stop") and "precedes run_start" in line



def test_the_launched_seed_stands_in_for_one_the_log_never_recorded(tmp_path, capsys):
    """A run stopped after its log began but before it logged its seed (a Ctrl-C while it
    builds): the RESULT line names the seed run_and_time.sh launched it with; a logged seed
    wins over it."""
    events = [e for e in open_run() if e["key"] != "seed"]
    assert result_line(tmp_path, events, capsys).split(",")[2] == "None"
    assert result_line(tmp_path, events, capsys, "--seed", "7").split(",")[2] == "7"
    assert result_line(tmp_path, open_run(), capsys, "--seed", "7").split(",")[2] == "42"
