"""Two torchrun agents on this machine as two nodes (NNODES=2, NODE_RANK 0 and 1,
MASTER_ADDR=127.0.0.1; one gloo process each) through run_and_time.sh: a whole run on the
tiny config writes one log that passes compliance; a node lost mid-run (its agent and worker
killed) ends the other within ``LOST_S`` with run_stop aborted, a RESULT line and nothing left;
SLURM's variables, set by hand, stand for NNODES, NODE_RANK and the rendezvous
(docs/multinode.md)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.resnet.fixture import write_fixture
from compliance.check import check_log
from compliance.logs import summarize
from tests.entry_points import REPO, SMALL_RESNET_FIXTURE, SMALL_RESNET_FLAGS, ended

START_S = 120   # both agents up, the rendezvous made, the model built and run_start logged
LOST_S = 60     # a surviving node ends within this after its peer is lost (the test's bound)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def running(text: str) -> list[int]:
    """The processes whose command line holds ``text`` (torchrun starts its workers in
    sessions of their own: a process group does not hold them)."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and text in (proc / "cmdline").read_text():
                pids.append(int(proc.name))
        except OSError:   # exited meanwhile
            pass
    return pids


def wait_gone(text: str, seconds: float) -> bool:
    return ended(lambda: running(text), seconds)


class Node:
    """One node's run_and_time.sh in a session of its own, output to files."""

    def __init__(self, tmp_path: Path, benchmark: str, rank: int, env_extra: dict):
        self.dir = tmp_path / f"node{rank}"
        self.dir.mkdir()
        self.logdir = self.dir / "logs"
        env = dict(os.environ, CONFIG="cpu_tiny", SEED="1", LOGDIR=str(self.logdir),
                   OMP_NUM_THREADS="1",
                   PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
        env.pop("DATADIR", None)
        env.update(env_extra)
        with open(self.dir / "stdout", "w") as out, open(self.dir / "stderr", "w") as err:
            self.proc = subprocess.Popen(
                ["bash", str(REPO / f"benchmarks/{benchmark}/run_and_time.sh")], cwd=REPO,
                env=env, stdout=out, stderr=err, start_new_session=True)

    def output(self) -> str:
        return (self.dir / "stdout").read_text() + (self.dir / "stderr").read_text()

    def kill(self) -> None:
        """This node's script, launcher, workers and their loader processes."""
        for pid in [self.proc.pid, *running(str(self.logdir))]:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()


def two_nodes(tmp_path: Path, benchmark: str, slurm: bool = False, **env_extra) -> list[Node]:
    port = str(_free_port())
    if slurm:   # what an sbatch job's `srun --ntasks-per-node=1` gives each task
        envs = [{"SLURM_NNODES": "2", "SLURM_NTASKS": "2", "SLURM_NODEID": str(r),
                 "SLURM_JOB_NODELIST": "localhost", "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": port} for r in range(2)]
    else:
        envs = [{"NNODES": "2", "NODE_RANK": str(r), "MASTER_ADDR": "127.0.0.1",
                 "MASTER_PORT": port} for r in range(2)]
    return [Node(tmp_path, benchmark, r, {**env, **env_extra}) for r, env in enumerate(envs)]


def wait_for_run_start(nodes: list[Node]) -> Path:
    log = nodes[0].logdir / "result_0.txt"
    deadline = time.monotonic() + START_S
    while not (log.is_file() and '"key": "run_start"' in log.read_text()):
        for n in nodes:
            assert n.proc.poll() is None, n.output()[-3000:]
        assert time.monotonic() < deadline, nodes[0].output()[-3000:]
        time.sleep(0.2)
    return log


@pytest.mark.slow
@pytest.mark.parametrize("benchmark", ["resnet", "dlrm"])
def test_two_nodes_run_to_the_end_with_one_compliant_log(tmp_path, benchmark):
    small = {}   # ResNet's run on a smaller fixture than cpu_tiny's: seconds, not a minute
    if benchmark == "resnet":
        small = dict(DATADIR=str(write_fixture(tmp_path / "data", **SMALL_RESNET_FIXTURE)),
                     EXTRA_ARGS=SMALL_RESNET_FLAGS)
    nodes = two_nodes(tmp_path, benchmark, **small)
    try:
        for n in nodes:
            assert n.proc.wait(timeout=1500) == 0, n.output()[-3000:]
    finally:
        for n in nodes:
            n.kill()
    log = nodes[0].logdir / "result_0.txt"
    assert check_log(log).compliant and summarize(log).status == "success"
    assert not list(nodes[1].logdir.glob("result_*.txt"))   # one log, by global rank 0
    out = nodes[0].output()
    assert "2 process(es)" in out and "compliance PASS" in out
    assert [x for x in out.splitlines() if x.startswith("RESULT,")][0].split(",")[4] == "success"
    assert "RESULT," not in nodes[1].output()


@pytest.mark.parametrize("lost", [1, 0], ids=["node-1-lost", "node-0-lost"])
def test_a_lost_node_ends_the_other_within_a_bound(tmp_path, lost):
    """Node ``lost``'s agent is killed (SIGKILL) mid-run: its worker follows it (Linux's
    parent-death signal, common/dist.py), the other node's collective fails on the closed
    connection at once and its run ends; a peer gone without closing its connections would
    fail it after COLLECTIVE_TIMEOUT_S."""
    nodes = two_nodes(tmp_path, "resnet")   # minutes of training: DLRM's ends in seconds
    try:
        log = wait_for_run_start(nodes)
        time.sleep(2)
        (agent,) = [p for p in running(str(nodes[lost].logdir)) if b"common.launch" in
                    Path(f"/proc/{p}/cmdline").read_bytes()]
        os.kill(agent, signal.SIGKILL)
        survivor = nodes[1 - lost]
        try:
            rc = survivor.proc.wait(timeout=LOST_S)
        except subprocess.TimeoutExpired:
            pytest.fail(f"node {1 - lost} still running {LOST_S} s after node {lost} was lost")
        assert rc != 0, survivor.output()[-3000:]
        for n in nodes:
            assert wait_gone(str(n.logdir), 15), f"processes of node {nodes.index(n)} were left"
        if lost == 1:   # node 0 holds the log: run_stop aborted and a RESULT line
            assert summarize(log).status == "aborted"
            result = [x for x in survivor.output().splitlines() if x.startswith("RESULT,")]
            assert len(result) == 1 and result[0].split(",")[4] == "aborted"
    finally:
        for n in nodes:
            n.kill()


def test_slurm_variables_give_the_nodes_and_a_stop_ends_both(tmp_path):
    """SLURM_NNODES, SLURM_NODEID (MASTER_ADDR given: no scontrol here) make the same two-node
    run; a SIGTERM to each node's script, as scancel sends, ends both with run_stop aborted."""
    nodes = two_nodes(tmp_path, "dlrm", slurm=True)
    try:
        log = wait_for_run_start(nodes)
        assert "2 process(es)" in nodes[0].output()
        for n in nodes:
            os.kill(n.proc.pid, signal.SIGTERM)
        for n in nodes:
            assert n.proc.wait(timeout=LOST_S) == 128 + signal.SIGTERM, n.output()[-3000:]
        assert summarize(log).status == "aborted"
        for n in nodes:
            assert wait_gone(str(n.logdir), 10), "processes of a node were left"
    finally:
        for n in nodes:
            n.kill()
