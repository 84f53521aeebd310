"""Submission trees from real ResNet-50 logs, checked by the real MLCommons tools."""

import json
import shutil

import pytest

from compliance import package, system
from tests.compliance.conftest import field_flags


def pack(logdir, out, *extra) -> int:
    return package.main(["--submitter", "TestOrg", "--system", "cpu_tiny", "--benchmark",
                         "resnet", *field_flags(), *extra, str(logdir), str(out)])


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
    for check in ("system description", "run count", "compliance checker", "RCP checker",
                  "package checker", "result summarizer"):
        assert f"{check}: PASS" in stdout, stdout
    assert "bypassed: fixture data" in stdout and "fixture (not an MLPerf result)" in stdout
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
