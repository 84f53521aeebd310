"""Real ResNet-50 run logs for the packaging tests: one NEXP=5 run_and_time.sh per session."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.resnet.fixture import write_fixture
from compliance import package
from tests.compliance import e2e_logs, handmade_logs
from tests.entry_points import SMALL_RESNET_FIXTURE, SMALL_RESNET_FLAGS

REPO = Path(__file__).resolve().parents[2]
# The fields no machine can tell about itself.
USER_FIELDS = {"host_processor_frequency": "2450 MHz", "host_processor_interconnect": "N/A",
               "host_storage_type": "NVMe SSD", "host_storage_capacity": "1 TB",
               "host_networking": "N/A", "host_networking_topology": "N/A",
               "host_memory_configuration": "unknown", "cooling": "air"}


def field_flags() -> list[str]:
    return [x for k, v in USER_FIELDS.items() for x in ("--field", f"{k}={v}")]


def pack(logdir: Path, out: Path, *extra: str) -> int:
    """``compliance.package`` of ResNet logs as TestOrg's ``cpu_tiny``."""
    return package.main(["--submitter", "TestOrg", "--system", "cpu_tiny", "--benchmark",
                         "resnet", *field_flags(), *extra, str(logdir), str(out)])


@pytest.fixture(scope="session")
def handmade_tree(tmp_path_factory) -> Path:
    """A submission tree of five hand-written open-division fixture runs (no training)."""
    root = tmp_path_factory.mktemp("handmade")
    assert pack(handmade_logs.write_logdir(root / "logs"), root / "tree") == 0
    return root / "tree"


@pytest.fixture(scope="session")
def resnet_logs(tmp_path_factory) -> Path:
    """LOGDIR with result_0..4.txt from five real tiny ResNet-50 runs (seeds 100-104)."""
    root = tmp_path_factory.mktemp("resnet_runs")
    data = write_fixture(root / "data", **SMALL_RESNET_FIXTURE)
    env = dict(os.environ, DATADIR=str(data), LOGDIR=str(root / "logs"), NEXP="5", SEED="100",
               EXTRA_ARGS=SMALL_RESNET_FLAGS, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ['PATH']}")
    proc = subprocess.run(["bash", str(REPO / "benchmarks/resnet/run_and_time.sh")], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    logs = sorted((root / "logs").glob("result_*.txt"))
    e2e_logs.keep("resnet-nexp5", *logs)
    return root / "logs"
