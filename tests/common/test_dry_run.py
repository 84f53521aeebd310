"""``--dry-run`` / ``DRY_RUN``: a bounded, timed run of a config whose log never passes for a
result, and the projected time-to-train computed from it (``compliance.projection``)."""

import json
import time

import pytest
import torch

from common import dry_run
from common.dry_run import DRY_RUN_KEY, REPORT_KEY, Report, percentile, short_epoch_note
from compliance import package, projection
from compliance.check import check_log
from compliance.logs import read_events
from tests.compliance.conftest import field_flags
from tests.entry_points import run_script


def report(**changes) -> Report:
    fields = dict(steps=4, global_batch_size=10, steps_per_epoch=8, init_s=3.0,
                  step_p50_s=0.5, step_p99_s=1.0, input_wait_p50_s=0.1, train_s=4.0,
                  input_wait_s=2.0, eval_s=1.0, eval_samples=100, peak_device_bytes=0,
                  peak_host_bytes=2**30, eval_points=[[4, 0.5], [8, 1.0], [16, 2.0]],
                  train_samples=80, full_dataset=None)
    return Report(**{**fields, **changes})


def test_a_slow_step_says_what_ran_in_it(tmp_path, capsys):
    """The first step, and a step over 3x the median before it, get a line of their own as
    they end (a run stopped by a time limit never prints its report), naming what compiled or
    started a process in them."""
    from common.training import main
    from tests.common.toy_workload import ToyWorkload

    code = main(ToyWorkload, ["--device", "cpu", "--precision", "fp32", "--seed", "3",
                              "--log-file", str(tmp_path / "log.txt"), "--dry-run", "7",
                              "--step-sleep", "0.02", "--slow-step", "5"])
    out = capsys.readouterr().out
    assert code == 0
    slow = [line for line in out.splitlines() if " took " in line]
    assert [line.split(" took ")[0] for line in slow] == ["dry run: step 1",
                                                          "dry run: step 5"], out
    assert "compiled or recorded: nothing; processes started: 0" in slow[1]
    line = dry_run.slow_step_line(3, 2.5, 0.001, [(3, "CUDAGRAPH_RECORDING", 0.7),
                                                  (3, "CUDAGRAPH_RECORDING", 0.4),
                                                  (2, "DYNAMO", 9.0), (3, "DYNAMO", 1.25)],
                                  [(3, "nvcc ...", ""), (None, "ls", "")])
    assert line == ("dry run: step 3 took 2,500.0 ms (input wait 1.0 ms; compiled or recorded: "
                    "CUDAGRAPH_RECORDING 2 x, 1.1 s, DYNAMO 1 x, 1.2 s; processes started: 1)")
    assert dry_run.slow([1.0]) and dry_run.slow([1.0, 1.2, 3.7]) \
        and not dry_run.slow([1.0, 1.2, 3.2])   # the median before: 1.1


def test_percentiles_by_the_nearest_rank():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [percentile(values, q) for q in (0, 20, 50, 99, 100)] == [1.0, 1.0, 3.0, 5.0, 5.0]


def test_a_stand_in_fraction_is_noted_for_its_epoch_schedules():
    """The SSD dry run on a 10% COCO stand-in ran its 2.62 warm-up epochs in 30 steps, not
    300, and its loss diverged: the run says so before its steps."""
    note = short_epoch_note(11_711, (117_266, 5_000))
    assert "1/10.0 of the real dataset's" in note and "10.0x sooner" in note
    assert short_epoch_note(117_266, (117_266, 5_000)) is None
    assert short_epoch_note(100, None) is None


def test_flagperf_throughputs_over_the_dry_runs_samples():
    r = Report.measure([1.0, 0.5, 2.5], [0.5, 0.0, 0.5], global_batch_size=10,
                       steps_per_epoch=None, init_s=5.0, eval_s=2.0, eval_samples=7,
                       peak_device_bytes=0, peak_host_bytes=0, eval_points=[[3, 30]],
                       train_samples=30, full_dataset=None)
    assert (r.steps, r.step_p50_s, r.step_p99_s, r.input_wait_p50_s) == (3, 1.0, 2.5, 0.5)
    assert r.p_whole == 30 / (5 + 4 + 2)     # initialization, steps and evaluation
    assert r.p_train == 30 / 4               # the steps with their waits for input
    assert r.p_core == 30 / 3                # the steps less those waits


@pytest.mark.parametrize("mean, steps, evaluations", [(0.4, 4, 1), (1.0, 8, 2), (1.5, 16, 3)])
def test_the_run_stops_at_the_first_evaluation_at_or_past_the_rcp_mean(monkeypatch, mean,
                                                                       steps, evaluations):
    monkeypatch.setattr(projection, "rcp_mean", lambda *_: (mean, "an RCP"))
    monkeypatch.setattr(projection, "read_events", lambda _: [
        {"key": DRY_RUN_KEY, "value": 4}, {"key": REPORT_KEY, "value": report().as_dict()},
        {"key": "submission_benchmark", "value": "resnet"}])
    p = projection.project("log")
    assert (p.steps, p.evaluations) == (steps, evaluations)
    assert p.seconds == steps * 0.5 + evaluations * 1.0   # step p50 and the evaluation
    # beside it, the steps' mean: train_s 4.0 over 4 steps
    assert p.seconds_at_mean == steps * 1.0 + evaluations * 1.0
    assert "at the timed steps' mean (1000.00 ms, their one-off costs included)" in p.line()


@pytest.mark.parametrize("benchmark, unit", [("resnet", "1 epochs"),
                                             ("bert", "1 training samples")])
def test_the_rcp_mean_is_named_in_the_benchmarks_unit(monkeypatch, benchmark, unit):
    """BERT's RCPs and epoch_num count training samples, the others' epochs."""
    monkeypatch.setattr(projection, "rcp_mean", lambda *_: (1.0, "an RCP"))
    monkeypatch.setattr(projection, "read_events", lambda _: [
        {"key": DRY_RUN_KEY, "value": 4}, {"key": REPORT_KEY, "value": report().as_dict()},
        {"key": "submission_benchmark", "value": benchmark}])
    assert f"converges in {unit} on average" in projection.project("log").line()


@pytest.mark.parametrize("full, steps, eval_s", [
    ([80, 100], 8, 1.0),        # the real dataset: nothing scaled
    ([800, 1000], 80, 10.0),    # a tenth of it: 10x the steps per epoch and the evaluation
    ([805, 100], 80, 1.0),      # a step per epoch of the real dataset is whole batches
])
def test_a_stand_in_fraction_is_scaled_to_the_real_dataset(monkeypatch, full, steps, eval_s):
    monkeypatch.setattr(projection, "rcp_mean", lambda *_: (1.0, "an RCP"))
    monkeypatch.setattr(projection, "read_events", lambda _: [
        {"key": DRY_RUN_KEY, "value": 4},
        {"key": REPORT_KEY, "value": report(full_dataset=full).as_dict()},
        {"key": "submission_benchmark", "value": "resnet"}])
    p = projection.project("log")
    assert (p.steps, p.evaluations, p.eval_s) == (steps, 2, eval_s)
    assert p.seconds == steps * 0.5 + 2 * eval_s
    assert ("scaled to the real dataset's" in p.line()) == (full != [80, 100])


def test_later_evaluations_take_the_second_ones_time_where_batches_are_kept(monkeypatch):
    monkeypatch.setattr(projection, "rcp_mean", lambda *_: (1.5, "an RCP"))
    monkeypatch.setattr(projection, "read_events", lambda _: [
        {"key": DRY_RUN_KEY, "value": 4},
        {"key": REPORT_KEY, "value": report(eval_again_s=0.25, full_dataset=[80, 200]).as_dict()},
        {"key": "submission_benchmark", "value": "dlrm"}])
    p = projection.project("log")          # 3 evaluations of twice the run's evaluation set
    assert (p.evaluations, p.eval_s, p.later_eval_s) == (3, 2.0, 0.5)
    assert p.seconds == 16 * 0.5 + 2.0 + 2 * 0.5
    assert "the first evaluation 2.00 s + 2 x 0.50 s (from the batches it kept)" in p.line()


def test_a_schedule_that_ends_before_the_rcp_mean_names_the_fix(monkeypatch):
    monkeypatch.setattr(projection, "rcp_mean", lambda *_: (2.5, "an RCP"))
    monkeypatch.setattr(projection, "read_events", lambda _: [
        {"key": DRY_RUN_KEY, "value": 4}, {"key": REPORT_KEY, "value": report().as_dict()},
        {"key": "submission_benchmark", "value": "resnet"}])
    with pytest.raises(ValueError, match="raise the schedule.s cap"):
        projection.project("log")


def test_rcp_means_found_interpolated_and_below_the_smallest():
    mean, where = projection.rcp_mean("resnet", 1632, "1.1.0")
    assert where == "the RCP of batch 1632" and 30 < mean < 50
    between, where = projection.rcp_mean("resnet", 2000, "1.1.0")
    assert where.startswith("interpolated between the RCPs of batches 1632 and")
    assert between >= mean
    assert projection.rcp_mean("dlrm", 512, "1.1.0")[1] == "the smallest RCP's, batch 32768"


@pytest.mark.slow
def test_a_dry_run_through_run_and_time_projects_and_is_never_a_result(tmp_path, capsys):
    proc = run_script("dlrm", {"CONFIG": "cpu_tiny", "SEED": "3", "DRY_RUN": "12",
                               "LOGDIR": str(tmp_path / "logs")}, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "dry run: 12 steps of 512" in proc.stdout and "RESULT," not in proc.stdout
    assert "projected time-to-train (a projection, not a result)" in proc.stdout
    log = tmp_path / "logs" / "result_0.txt"
    events = {e["key"]: e for e in read_events(log)}
    assert events[DRY_RUN_KEY]["value"] == 12
    assert events["run_stop"]["metadata"]["status"] == "aborted"
    measured = Report(**events[REPORT_KEY]["value"])
    assert measured.steps == 12 and measured.eval_again_s > 0   # cache-eval: timed again
    assert "(again, from the batches it kept:" in proc.stdout
    verdict = check_log(log)
    assert not verdict.compliant and "a dry run's log" in verdict.problems[0]
    out = tmp_path / "tree"
    assert package.main(["--submitter", "TestOrg", "--system", "cpu_tiny", "--benchmark",
                         "dlrm", *field_flags(), str(log.parent), str(out)]) != 0
    assert "a dry run's log" in capsys.readouterr().out
    assert projection.main([str(log), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert doc["report"]["steps"] == 12 and doc["seconds"] > 0


def test_the_projection_of_a_log_that_is_no_dry_run_is_one_line(tmp_path, capsys):
    log = tmp_path / "result_0.txt"
    log.write_text(':::MLLOG {"namespace": "", "time_ms": 1, "event_type": "POINT_IN_TIME", '
                   '"key": "run_start", "value": null, "metadata": {}}\n')
    assert projection.main([str(log)]) == 2
    assert capsys.readouterr().err == (f"error: {log} is not a dry run's log: run with "
                                       f"--dry-run STEPS (run_and_time.sh: DRY_RUN=STEPS)\n")


def test_a_report_edited_by_hand_is_one_line(monkeypatch):
    monkeypatch.setattr(projection, "read_events", lambda _: [
        {"key": DRY_RUN_KEY, "value": 4}, {"key": REPORT_KEY, "value": {"steps": 4}},
        {"key": "submission_benchmark", "value": "resnet"}])
    with pytest.raises(ValueError, match="is not one this suite writes"):
        projection.project("log")


def _clocked(clock: dry_run.StepClock, load_s: float, step, steps: int = 4):
    times = []
    for _ in range(steps):
        time.sleep(load_s)   # the host loading the next batch
        clock.input_ready()
        step()
        times += clock.step_queued()
    return times + clock.finish()


def test_on_the_cpu_a_step_counts_its_loading_as_its_wait():
    times = _clocked(dry_run.StepClock(cuda=False), 0.03, lambda: time.sleep(0.02))
    assert len(times) == 4
    for step, wait in times:
        assert 0.03 <= wait < 0.045 and 0.05 <= step < 0.08, times


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_on_a_gpu_loading_under_the_step_before_is_no_wait():
    """Host loading (30 ms) shorter than the GPU's step (about 60 ms) overlaps the step before:
    the steps after the first wait for nothing and take the GPU's time; loading longer than
    the step (90 ms) leaves the GPU idle for the difference, counted as the wait."""
    torch.cuda._sleep(1000)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(10**7)
    end.record()
    end.synchronize()
    cycles = int(10**7 * 60 / start.elapsed_time(end))   # about 60 ms of GPU time

    times = _clocked(dry_run.StepClock(cuda=True), 0.03, lambda: torch.cuda._sleep(cycles))
    for step, wait in times[1:]:
        assert wait < 0.005 and 0.05 < step < 0.075, times
    times = _clocked(dry_run.StepClock(cuda=True), 0.09, lambda: torch.cuda._sleep(cycles))
    for step, wait in times[1:]:
        assert 0.02 < wait < 0.04 and 0.08 < step < 0.1, times


def test_profiled_steps_need_a_dry_run_and_a_gpu(tmp_path, capsys):
    from common.training import EXIT_USER_ERROR, main
    from tests.common.toy_workload import ToyWorkload

    base = ["--device", "cpu", "--precision", "fp32", "--seed", "3",
            "--log-file", str(tmp_path / "log.txt"), "--dry-run-profile", "2"]
    with pytest.raises(SystemExit) as exc:
        main(ToyWorkload, base)
    assert exc.value.code == EXIT_USER_ERROR
    assert "--dry-run-profile profiles steps after a dry run's: add --dry-run STEPS" \
        in capsys.readouterr().err
    assert main(ToyWorkload, [*base, "--dry-run", "3"]) == EXIT_USER_ERROR
    assert "--dry-run-profile profiles GPU kernels: drop it on the CPU" \
        in capsys.readouterr().err


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_dry_run_profiles_steps_after_the_timed_ones(tmp_path, capsys):
    """The profiled steps come after the timed ones (not in their figures) and say where the
    GPU time went and what the host ran while the GPU waited."""
    from common.training import main
    from tests.common.toy_workload import ToyWorkload

    code = main(ToyWorkload, ["--device", "cuda", "--precision", "fp32", "--seed", "3",
                              "--log-file", str(tmp_path / "log.txt"), "--dry-run", "3",
                              "--dry-run-profile", "2", "--step-sleep", "0.02"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "dry run: 3 steps, step p50" in out and "2 more steps profiled" in out
    assert "GPU kernel time per step:" in out
    assert "GPU idle time by the host operation running as it began" in out
