from common.mllog import MLLog, constants
from compliance.logs import read_events


def test_rank0_writes_events_with_metadata(tmp_path):
    log = MLLog(tmp_path / "a" / "log.txt", rank=0)
    log.start(constants.INIT_START)
    log.event(constants.SEED, 7)
    log.end(constants.EPOCH_STOP, metadata={constants.EPOCH_NUM: 2})
    log.close()
    events = read_events(tmp_path / "a" / "log.txt")
    assert [e["key"] for e in events] == ["init_start", "seed", "epoch_stop"]
    assert events[0]["event_type"] == "INTERVAL_START"
    assert events[1]["value"] == 7
    assert events[2]["metadata"]["epoch_num"] == 2
    # the call site is this test file, not the wrapper
    assert events[1]["metadata"]["file"].endswith("test_mllog.py")


def test_other_ranks_write_nothing(tmp_path):
    log = MLLog(tmp_path / "log.txt", rank=1)
    log.event(constants.SEED, 1)
    log.close()
    assert not (tmp_path / "log.txt").exists()


def test_two_logs_in_one_process_do_not_mix(tmp_path):
    a, b = MLLog(tmp_path / "a.txt"), MLLog(tmp_path / "b.txt")
    a.event(constants.SEED, 1)
    b.event(constants.SEED, 2)
    a.close()
    b.close()
    assert [e["value"] for e in read_events(tmp_path / "a.txt")] == [1]
    assert [e["value"] for e in read_events(tmp_path / "b.txt")] == [2]
