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
    innermost = watch.samples[1][0]
    assert innermost.startswith("test_stalls.py:") and innermost.endswith("_slow_part")
