import gc
import re
import weakref

from common import gc_pauses


class Node:
    def __init__(self):
        self.me = self   # a reference cycle: only the cyclic collector frees it


def test_the_meter_times_each_collection_and_lets_go_of_the_collector():
    with gc_pauses.PauseMeter() as meter:
        gc.collect()
        gc.collect(0)
    assert meter._callback not in gc.callbacks
    s = meter.summary()
    assert s["collections"] == 2 and s["full"] == 1
    assert s["ms"] >= s["longest_ms"] > 0
    gc.collect()
    assert meter.summary() == s   # nothing counted after the block


def test_freeze_puts_what_exists_out_of_the_collectors_reach():
    before, after = Node(), None
    try:
        # torch's and pytest's objects; a thread an earlier test left (a loader's) may free a
        # frozen object between the two reads, so the count can only have fallen
        assert gc_pauses.freeze() >= gc.get_freeze_count() > 1000
        after = Node()
        frozen, fresh = weakref.ref(before), weakref.ref(after)
        del before, after
        gc.collect()
        assert frozen() is not None   # a frozen cycle stays: full collections skip it
        assert fresh() is None        # a cycle made after the freeze is collected
    finally:
        gc.unfreeze()
    gc.collect()
    assert frozen() is None


def test_the_trainer_freezes_only_when_asked_and_reports_the_pauses(tmp_path, monkeypatch, capsys):
    from common.training import main
    from compliance.logs import summarize
    from tests.common.toy_workload import ToyWorkload

    calls = []
    monkeypatch.setattr(gc_pauses, "freeze", lambda: calls.append("freeze"))
    for flags, frozen in (([], []), (["--gc-freeze"], ["freeze"])):
        log = tmp_path / f"log{len(flags)}.txt"
        code = main(ToyWorkload, ["--device", "cpu", "--precision", "fp32", "--seed", "3",
                                  "--log-file", str(log), *flags])
        assert code == 0 and summarize(log).status == "success" and calls == frozen
    # each training block's line reports the collector's pauses in it
    assert re.search(r"training to epoch_num 1: .*, garbage-collector pauses \d+ ms "
                     r"\(\d+ full collections\)", capsys.readouterr().out)
