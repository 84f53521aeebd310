"""The Mask R-CNN entry point end to end on the CPU fixture."""

import pytest

from compliance.check import check_log
from compliance.logs import read_events, summarize
from tests.compliance import e2e_logs
from tests.entry_points import TWO_THREADS, run_script


@pytest.mark.slow
def test_tiny_config_reaches_both_targets_and_passes_compliance(tmp_path):
    proc = run_script("maskrcnn", {"CONFIG": "cpu_tiny", "LOGDIR": str(tmp_path), "SEED": "100",
                                   **TWO_THREADS}, timeout=900)
    log = tmp_path / "result_0.txt"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert check_log(log).compliant and "compliance PASS" in proc.stdout
    summary = summarize(log)
    assert summary.status == "success" and summary.dataset.startswith("fixture")
    last = [e["value"] for e in read_events(log) if e["key"] == "eval_accuracy"][-1]
    assert last["BBOX"] >= 0.377 and last["SEGM"] >= 0.339
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT,")]
    assert len(result) == 1 and result[0].split(",")[1:3] == ["maskrcnn", "100"]
    e2e_logs.keep("maskrcnn", log)
