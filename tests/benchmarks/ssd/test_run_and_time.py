"""The SSD entry point end to end on the CPU fixture."""

import pytest

from compliance.check import check_log
from compliance.logs import summarize
from tests.compliance import e2e_logs
from tests.entry_points import ONE_THREAD, run_script


@pytest.mark.slow
def test_tiny_config_reaches_target_and_passes_compliance(tmp_path):
    proc = run_script("ssd", {"CONFIG": "cpu_tiny", "LOGDIR": str(tmp_path), "SEED": "100",
                              **ONE_THREAD}, timeout=900)
    log = tmp_path / "result_0.txt"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert check_log(log).compliant and "compliance PASS" in proc.stdout
    summary = summarize(log)
    assert summary.status == "success" and summary.last_quality >= 0.23
    assert summary.dataset.startswith("fixture")
    result = [line for line in proc.stdout.splitlines() if line.startswith("RESULT,")]
    assert len(result) == 1 and result[0].split(",")[1:3] == ["ssd", "100"]
    e2e_logs.keep("ssd", log)
