import subprocess
import sys
import threading
import time

from common.stalls import StallWatch


def _slow_part():
    time.sleep(0.15)


def test_a_step_past_its_limit_is_sampled_where_it_waits():
    with StallWatch(period_s=0.005) as watch:
        watch.begin(0, 0.05)
        time.sleep(0.01)          # under the limit: nothing sampled
        watch.end()
        watch.begin(1, 0.05)
        _slow_part()
        watch.end()
        watch.begin(2, None)      # no limit: never sampled
        _slow_part()
        watch.end()
    assert set(watch.samples) == {1}
    stepping = watch.samples[1][0]   # the stepping thread's line first, innermost frame first
    assert stepping.split(" <- ")[0].startswith("test_stalls.py:")
    assert stepping.split(" <- ")[0].endswith("_slow_part")


def test_a_busy_side_thread_is_sampled_beside_the_waiting_one_and_a_parked_one_is_not():
    """The busy thread is listed even when a sample lands inside ``Event.is_set`` (a frame
    of threading.py that is not a wait)."""
    done = threading.Event()

    def spin():
        while not done.is_set():
            sum(range(10))

    side = threading.Thread(target=spin, name="side")
    parked = threading.Thread(target=done.wait, name="parked")
    side.start()
    parked.start()
    with StallWatch(period_s=0.002) as watch:
        for step in range(5):
            watch.begin(step, 0.02)
            _slow_part()
            watch.end()
    done.set()
    side.join()
    parked.join()
    for step in range(5):
        lines = watch.samples[step]
        assert "_slow_part" in lines[0]
        assert [line for line in lines[1:] if line.startswith("[side] ")], lines
        assert not [line for line in lines if line.startswith("[parked] ")], lines


def _start_child():
    subprocess.run([sys.executable, "-c", "pass"], check=True)


def test_subprocesses_started_while_open_are_listed_with_their_step_and_caller():
    with StallWatch() as watch:
        watch.begin(3, None)
        _start_child()
        watch.end()
        _start_child()            # between steps
    _start_child()                # after the watch: not listed
    assert [step for step, _, _ in watch.spawned] == [3, None]
    step, command, where = watch.spawned[0]
    assert command.startswith(sys.executable) and command.endswith("-c pass")
    assert where.split(" <- ")[0].endswith("_start_child")


def test_compilations_while_open_are_listed_with_their_step_and_kind():
    """A function compiled at its first call inside step 2, again for a new input rank in
    step 4 (Dynamo traces the frame anew); a call after the watch is not listed."""
    import torch

    torch._dynamo.reset()
    double = torch.compile(lambda x: x * 2, backend="eager")
    with StallWatch() as watch:
        for step, x in enumerate([None, None, torch.ones(3), torch.ones(3), torch.ones(2, 2)]):
            watch.begin(step, None)
            if x is not None:
                double(x)
            watch.end()
    double(torch.ones(2, 2, 2))
    assert [(step, what) for step, what, _ in watch.compiles] == [(2, "DYNAMO"),
                                                                  (4, "DYNAMO")]
    assert all(seconds > 0 for _, _, seconds in watch.compiles)
