"""Submission trees from real ResNet-50 logs, checked by the real MLCommons tools."""

import csv
import json
import shutil

import pytest

from compliance import mlperf_tools, package, summarize, system
from tests.compliance import handmade_logs
from tests.compliance.conftest import pack


@pytest.fixture(scope="module")
def good_tree(resnet_logs, tmp_path_factory):
    out = tmp_path_factory.mktemp("tree")
    assert pack(resnet_logs, out) == 0
    return out


@pytest.mark.slow
def test_fixture_logs_make_a_passing_tree(resnet_logs, tmp_path, capsys):
    out = tmp_path / "tree"
    assert pack(resnet_logs, out) == 0
    stdout = capsys.readouterr().out
    for check in ("system description", "run count", "compliance checker", "seeds",
                  "package checker", "result summarizer"):
        assert f"{check}: PASS" in stdout, stdout
    assert f"RCP checker: {mlperf_tools.BYPASSED}" in stdout.splitlines()
    assert "fixture (not an MLPerf result)" in stdout
    results = out / "results/cpu_tiny/resnet"
    assert sorted(p.name for p in results.glob("result_*.txt")) == [
        f"result_{i}.txt" for i in range(5)]
    assert (results / "package_checker_params").read_text() == "rcp-bypass"
    desc = json.loads((out / "systems/cpu_tiny.json").read_text())
    assert set(system.REQUIRED_FIELDS) <= set(desc)
    assert all(isinstance(v, str) for v in desc.values())
    assert desc["submitter"] == "TestOrg" and desc["division"] == "closed"
    assert desc["accelerators_per_node"] == "0" and desc["cooling"] == "air"
    impl = out / "benchmarks/resnet/implementations/pytorch"
    assert (impl / "benchmarks/resnet/workload.py").is_file()
    assert "commit" in json.loads((impl / "CODE_REFERENCE.json").read_text())


@pytest.mark.slow
def test_missing_run_fails(resnet_logs, tmp_path, capsys):
    logs = tmp_path / "logs"
    shutil.copytree(resnet_logs, logs)
    (logs / "result_3.txt").unlink()
    assert pack(logs, tmp_path / "tree") == 1
    out = capsys.readouterr().out
    assert "run count: FAIL: 4 result files, the 1.1.0 rules need 5 for resnet" in out
    assert "package checker: FAIL" in out


@pytest.mark.slow
def test_non_compliant_log_fails(resnet_logs, tmp_path, capsys):
    logs = tmp_path / "logs"
    shutil.copytree(resnet_logs, logs)
    victim = logs / "result_2.txt"
    lines = victim.read_text().splitlines(keepends=True)
    victim.write_text("".join(x for x in lines if '"tensor": "fc1_bias"' not in x))
    assert pack(logs, tmp_path / "tree") == 1
    out = capsys.readouterr().out
    assert "compliance checker: FAIL: result_2.txt not compliant" in out


@pytest.mark.slow
def test_wrong_system_json_fails(good_tree, tmp_path, capsys):
    tree = tmp_path / "tree"
    shutil.copytree(good_tree, tree)
    desc_file = tree / "systems/cpu_tiny.json"
    desc = json.loads(desc_file.read_text())
    del desc["cooling"]
    desc_file.write_text(json.dumps(desc))
    capsys.readouterr()
    assert package.main(["--check", str(tree)]) == 1
    out = capsys.readouterr().out
    assert "system description: FAIL" in out and "Missing field cooling" in out
    assert "package checker: FAIL" in out


@pytest.mark.slow
def test_undetectable_fields_are_asked_for(resnet_logs, tmp_path, capsys):
    code = package.main(["--submitter", "TestOrg", "--system", "cpu_tiny", "--benchmark",
                         "resnet", str(resnet_logs), str(tmp_path / "tree")])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cooling" in err[0] and "--field NAME=VALUE" in err[0]
    assert not (tmp_path / "tree").exists()


def test_bad_inputs(tmp_path, capsys):
    assert package.main(["--submitter", "o", "--system", "s", "--benchmark", "resnet",
                         str(tmp_path / "none"), str(tmp_path / "out")]) == 2
    assert "no such log directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert package.main(["--submitter", "o", "--system", "s", "--benchmark", "resnet",
                         str(tmp_path / "empty"), str(tmp_path / "out")]) == 2
    assert "no result_<i>.txt logs" in capsys.readouterr().err
    assert package.main(["--check", str(tmp_path / "empty")]) == 2
    assert "not a submission tree" in capsys.readouterr().err


def test_detected_fields_are_never_empty():
    detected = system.detect()
    assert detected["number_of_nodes"] == 1
    assert all(v not in (None, "") for v in detected.values())
    desc = system.describe({"submitter": "o"}, detected)
    assert "submitter" not in system.missing_fields(desc)
    assert "cooling" in system.missing_fields(desc)


def refusal(capsys) -> str:
    """The one line of a refusal (exit status 2), which comes before any verdict."""
    out, err = capsys.readouterr()
    assert out == ""
    (line,) = err.splitlines()
    assert line.startswith("error: ")
    return line


def tree_refusal(tree, capsys) -> str:
    """The refusal of ``package --check`` and of ``summarize`` on a tree, the same line."""
    lines = set()
    for main, argv in ((package.main, ["--check", str(tree)]), (summarize.main, [str(tree)])):
        assert main(argv) == 2
        lines.add(refusal(capsys))
    (line,) = lines
    return line


def copy(tree, tmp_path):
    return shutil.copytree(tree, tmp_path / "tree")


def edit_json(path, **fields):
    path.write_text(json.dumps({**json.loads(path.read_text()), **fields}))


def closed(event):
    return {**event, "value": "closed"} if event["key"] == "submission_division" else event


def test_a_repeated_seed_fails_in_the_open_division(tmp_path, capsys):
    logs = handmade_logs.write_logdir(tmp_path / "logs", seeds=(7, 8, 7, 9, 10))
    assert pack(logs, tmp_path / "tree") == 1
    out = capsys.readouterr().out
    assert "seeds: FAIL: result_0.txt and result_2.txt share seed 7: " in out


def test_a_division_other_than_the_logs_is_refused(handmade_tree, tmp_path, capsys):
    """Open skips the package checker's seed and RCP checks: the division must be the runs'."""
    logs = handmade_logs.write_logdir(tmp_path / "logs")
    for log in logs.glob("result_*.txt"):
        handmade_logs.edit(log, closed)
    assert pack(logs, tmp_path / "out", "--field", "division=open") == 2
    line = refusal(capsys)
    assert line.startswith("error: system description: division 'open', but the logs' "
                           "submission_division is 'closed'")
    assert line.endswith("correct it with --field NAME=VALUE (or in --system-desc FILE)")
    assert not (tmp_path / "out").exists()
    tree = copy(handmade_tree, tmp_path)
    edit_json(tree / "systems/cpu_tiny.json", division="closed")
    assert tree_refusal(tree, capsys).startswith(
        f"error: {tree / 'systems/cpu_tiny.json'}: division 'closed', but the logs' "
        f"submission_division is 'open'")


def test_logs_of_two_divisions_are_refused(tmp_path, capsys):
    logs = handmade_logs.write_logdir(tmp_path / "logs")
    handmade_logs.edit(logs / "result_3.txt", closed)
    assert pack(logs, tmp_path / "out") == 2
    assert refusal(capsys) == (f"error: {logs / 'result_3.txt'}: submission_division 'closed', "
                               f"but result_0.txt's is 'open': package open and closed runs "
                               f"separately")


def test_fixture_and_real_runs_are_refused_together(handmade_tree, tmp_path, capsys):
    """One fixture run would otherwise write the RCP bypass for the real ones."""
    def real(event):
        return {**event, "value": "ImageNet"} if event["key"] == "dataset" else event

    logs = handmade_logs.write_logdir(tmp_path / "logs")
    for i in (0, 1, 2, 4):
        handmade_logs.edit(logs / f"result_{i}.txt", real)
    assert pack(logs, tmp_path / "out") == 2
    assert refusal(capsys) == (
        f"error: {logs}: fixture runs (result_3.txt) mixed with real-data runs (result_0.txt, "
        f"result_1.txt, result_2.txt, result_4.txt): the fixture's RCP bypass would cover the "
        f"real runs too; package them separately")
    assert not (tmp_path / "out").exists()
    tree = copy(handmade_tree, tmp_path)
    handmade_logs.edit(tree / "results/cpu_tiny/resnet/result_1.txt", real)
    assert "mixed with real-data runs (result_1.txt)" in tree_refusal(tree, capsys)


def test_a_bypassed_rcp_check_is_no_pass(handmade_tree, tmp_path, capsys):
    bypassed = "BYPASSED (fixture data: RCPs describe the real dataset)"
    tree = copy(handmade_tree, tmp_path)
    assert package.main(["--check", str(tree)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert f"RCP checker: {bypassed}" in out
    assert not any(line.startswith("RCP checker: PASS") for line in out)
    with open(tree / "summary.csv") as f:
        (rec,) = list(csv.DictReader(f))
    assert rec["rcp"] == bypassed


@pytest.mark.parametrize("field, value", [
    ("number_of_nodes", "many"), ("host_processors_per_node", "0"),
    ("accelerators_per_node", "-1"), ("status", "available"), ("division", "secret"),
    ("system_name", "other"),
])
def test_system_fields_are_validated_before_any_check(handmade_tree, tmp_path, capsys, field,
                                                      value):
    logs = handmade_logs.write_logdir(tmp_path / "logs")
    assert pack(logs, tmp_path / "out", "--field", f"{field}={value}") == 2
    line = refusal(capsys)
    assert line.startswith(f"error: system description: {field}={value!r} is not ")
    assert line.endswith("correct it with --field NAME=VALUE (or in --system-desc FILE)")
    assert not (tmp_path / "out").exists()
    tree = copy(handmade_tree, tmp_path)
    json_file = tree / "systems/cpu_tiny.json"
    edit_json(json_file, **{field: value})
    assert tree_refusal(tree, capsys).startswith(f"error: {json_file}: {field}={value!r} is not ")


@pytest.mark.parametrize("key, change", [
    ("no submission_benchmark event",
     lambda e: None if e["key"] == "submission_benchmark" else e),
    ("run_stop without metadata status",
     lambda e: {**e, "metadata": {}} if e["key"] == "run_stop" else e),
    ("eval_accuracy without metadata epoch_num",
     lambda e: {**e, "metadata": {}} if e["key"] == "eval_accuracy" else e),
])
def test_a_log_lacking_a_key_the_checkers_need_is_named(handmade_tree, tmp_path, capsys, key,
                                                        change):
    """Not the RCP or package checker's bare ``KeyError``."""
    tree = copy(handmade_tree, tmp_path)
    log = tree / "results/cpu_tiny/resnet/result_2.txt"
    handmade_logs.edit(log, change)
    assert tree_refusal(tree, capsys) == (f"error: {log}: {key}, which the checkers need: "
                                          f"rerun the benchmark or leave this log out")


def snapshot(folder) -> dict:
    return {p.relative_to(folder): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def test_packaging_never_writes_over_its_input(handmade_tree, tmp_path, capsys):
    """Packaging again from a tree's own results deleted all its logs."""
    tree = copy(handmade_tree, tmp_path)
    results = tree / "results/cpu_tiny/resnet"
    before = snapshot(tree)
    assert pack(results, tree) == 2
    assert refusal(capsys) == (f"error: LOGDIR {results} lies in OUTDIR {tree}, which packaging "
                               f"rewrites: name a new OUTDIR (a tree is packaged again from a "
                               f"copy of its logs elsewhere)")
    assert snapshot(tree) == before
    desc = tree / "systems/cpu_tiny.json"
    assert pack(handmade_logs.write_logdir(tmp_path / "logs"), tree, "--system-desc",
                str(desc)) == 2
    assert refusal(capsys).startswith(f"error: --system-desc {desc} lies in OUTDIR {tree}")
    assert snapshot(tree) == before
    logs = tmp_path / "logs"
    before = snapshot(logs)
    assert pack(logs, logs / "tree") == 2
    assert refusal(capsys) == (f"error: OUTDIR {logs / 'tree'} lies in LOGDIR {logs}: name an "
                               f"OUTDIR outside it")
    assert snapshot(logs) == before


def rewrite(logdir, i, change):
    handmade_logs.edit(logdir / f"result_{i}.txt", change)


def aborted(event):
    if event["key"] == "run_stop":
        return {**event, "metadata": {**event["metadata"], "status": "aborted"}}
    return event


def test_an_aborted_run_counts_as_not_converged(tmp_path, capsys):
    """Infinite time, as the result summarizer and the RCP checker count it: the fastest run,
    aborted, becomes the slowest and is dropped; the score is not its time to train."""
    logs = handmade_logs.write_logdir(tmp_path / "logs")   # 4.9 5.9 6.9 7.9 8.9 s
    rewrite(logs, 0, aborted)
    assert pack(logs, tmp_path / "tree") == 0
    out = capsys.readouterr().out
    assert ("result summarizer: PASS: resnet on cpu_tiny: 0.132 min (did not converge: "
            "result_0.txt: infinite time, dropped as the slowest by olympic scoring)") in out
    (row,) = summarize.score_table(tmp_path / "tree")
    assert row.score_minutes == pytest.approx((6.9 + 7.9 + 8.9) / 3 / 60)
    assert row.cells()[3].startswith("inf(aborted) 0.098 ")
    with open(tmp_path / "tree/summary.csv") as f:
        (rec,) = list(csv.DictReader(f))
    assert rec["not_converged"].startswith("result_0.txt: infinite time")


def test_two_runs_that_did_not_converge_leave_no_score(tmp_path, capsys):
    logs = handmade_logs.write_logdir(tmp_path / "logs")
    rewrite(logs, 1, aborted)
    rewrite(logs, 3, aborted)
    assert pack(logs, tmp_path / "tree") == 1
    out = capsys.readouterr().out
    assert ("result summarizer: FAIL: resnet on cpu_tiny: no score (did not converge: "
            "result_1.txt, result_3.txt: no score, at most 1 of 5 may fail)") in out
    assert summarize.main([str(tmp_path / "tree")]) == 1
    assert capsys.readouterr().out.splitlines()[-1] == (
        "resnet on cpu_tiny: no score (did not converge: result_1.txt, result_3.txt: no score, "
        "at most 1 of 5 may fail)")


@pytest.mark.parametrize("change, message", [
    # a second evaluation, below ResNet's 0.759, after the one that met it
    (lambda e: [e, {**e, "value": 0.5}] if e["key"] == "eval_accuracy" else e,
     "{log}: run_stop says success, but its last eval_accuracy 0.5 does not meet the resnet "
     "target (v['value'] >= 0.7590 and v['value'] < 1.0, training_1.1.0/closed_resnet.yaml): "
     "the run did not converge; rerun it or leave this log out"),
    # "1" would not be seen as repeating result_0.txt's seed 1
    (lambda e: {**e, "value": "1"} if e["key"] == "seed" else e,
     '{log}: seed "1" is not an integer (the training program logs an int): rerun the '
     'benchmark'),
    (lambda e: {**e, "time_ms": handmade_logs.T0 + 100} if e["key"] == "run_stop" else e,
     f"{{log}}: run_stop with status success at the instant of run_start (time_ms "
     f"{handmade_logs.T0 + 100}): no run trains and evaluates in no time; rerun the benchmark"),
    (lambda e: {**e, "time_ms": "soon"} if e["key"] == "run_stop" else e,
     '{log}:20: run_stop: time_ms "soon" is not a number of milliseconds: the log was edited or '
     'damaged; rerun the benchmark'),
    (lambda e: {k: v for k, v in e.items() if k != "key"} if e["key"] == "cache_clear" else e,
     "{log}:6: key null is not a name: the log was edited or damaged; rerun the benchmark"),
    (lambda e: {**e, "metadata": {**e["metadata"], "status": 1}} if e["key"] == "run_stop"
     else e,
     "{log}: run_stop status 1 is not a word (the training program logs success or aborted): "
     "rerun the benchmark"),
], ids=["last-evaluation-below-target", "string-seed", "no-time-to-train", "string-time",
        "no-key", "numeric-status"])
def test_a_run_that_cannot_have_passed_is_refused(handmade_tree, tmp_path, capsys, change,
                                                  message):
    logs = handmade_logs.write_logdir(tmp_path / "logs")
    log = logs / "result_2.txt"
    handmade_logs.edit(log, change)
    assert pack(logs, tmp_path / "out") == 2
    assert refusal(capsys) == "error: " + message.format(log=log)
    assert not (tmp_path / "out").exists()
    tree = copy(handmade_tree, tmp_path)
    log = tree / "results/cpu_tiny/resnet/result_2.txt"
    handmade_logs.edit(log, change)
    assert tree_refusal(tree, capsys) == "error: " + message.format(log=log)


def test_packaging_never_writes_over_a_file_a_log_links_to(handmade_tree, tmp_path, capsys):
    """LOGDIR of links to a tree's own logs: packaging into that tree deleted all five."""
    tree = copy(handmade_tree, tmp_path)
    results = tree / "results/cpu_tiny/resnet"
    links = tmp_path / "links"
    links.mkdir()
    for log in results.glob("result_*.txt"):
        (links / log.name).symlink_to(log)
    before = snapshot(tree)
    assert pack(links, tree) == 2
    assert refusal(capsys) == (
        f"error: LOGDIR's result_0.txt (a link to {(results / 'result_0.txt').resolve()}) lies "
        f"in OUTDIR {tree}, which packaging rewrites: name a new OUTDIR (a tree is packaged "
        f"again from a copy of its logs elsewhere)")
    assert snapshot(tree) == before


def test_packaging_never_writes_over_the_code_it_copies(handmade_tree, tmp_path, capsys,
                                                        monkeypatch):
    """Run from the code a tree holds, packaging into that tree deleted the code first."""
    tree = copy(handmade_tree, tmp_path)
    code = tree / "benchmarks/resnet/implementations/pytorch"
    monkeypatch.setattr(package, "REPO", code)
    logs = handmade_logs.write_logdir(tmp_path / "logs")
    before = snapshot(tree)
    assert pack(logs, tree) == 2
    assert refusal(capsys) == (
        f"error: the code it packages ({code / 'pyproject.toml'}) lies in OUTDIR {tree}, which "
        f"packaging rewrites: name a new OUTDIR away from the code")
    assert snapshot(tree) == before
    assert pack(logs, code / "common/tree") == 2
    assert refusal(capsys) == (f"error: OUTDIR {code / 'common/tree'} lies in the code it "
                               f"packages ({code / 'common'}): name an OUTDIR outside it")
    assert snapshot(tree) == before


@pytest.mark.parametrize("benchmark", ["dlrm", "resnet"])
def test_the_rcp_checker_judges_every_benchmark_of_the_ruleset(tmp_path, benchmark):
    """mlperf_logging's RCP checker stopped with KeyError 'dlrm' on any DLRM submission (its
    run-count table lacks DLRM); its verdict on five fixture runs is now given."""
    for i in range(5):
        handmade_logs.write(tmp_path / f"result_{i}.txt",
                            handmade_logs.open_run(benchmark, seed=i, stop_ms=5000 + 1000 * i))
    verdict = mlperf_tools.rcp_verdict(tmp_path, "1.1.0", fixture=True)
    assert verdict.outcome == mlperf_tools.BYPASSED, verdict
