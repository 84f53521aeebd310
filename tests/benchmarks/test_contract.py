"""The driver contract, checked the same way for every registered workload (as AlgoPerf's
workload tests do): a new workload is covered by adding its name to ``WORKLOADS``.

Each builds its ``config_cpu_tiny.sh`` on its (cached) fixture and must log every key its
1.1.0 rules require exactly once, name the ruleset's initialized tensors, train two steps,
evaluate to metrics its target predicate judges, and train bit for bit the same after
``--init-steps 2`` as without.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from mlperf_logging import compliance_checker

from common.bench.worker import workload_class
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.errors import UserError
from common.mllog import MLLog
from common.precision import Precision
from common.training import build_parser, log_workload, warm_up
from compliance.logs import read_events

REPO = Path(__file__).resolve().parents[2]
WORKLOADS = ["resnet", "bert", "dlrm", "unet3d", "ssd", "maskrcnn", "rnnt"]
# smaller steps than the tiny config's where the full model on the CPU takes long
FASTER = {"resnet": ["--image-size", "32", "--batch-size", "8", "--eval-batch-size", "50",
                     "--workers", "0"],
          "unet3d": ["--overlap", "0"],
          "ssd": ["--width", "8", "--workers", "0"],
          "maskrcnn": ["--width", "4", "--workers", "0"],
          # an untrained transducer emits labels until the limit: a short one
          "rnnt": ["--max-symbols", "20"]}
RULES = Path(compliance_checker.__file__).parent / "training_1.1.0"
# keys the driver logs around the workload's own (submission, seed, init/run events)
DRIVER_KEYS = {"submission_org", "submission_platform", "submission_division",
               "submission_status", "submission_benchmark", "seed", "init_stop", "run_start",
               "run_stop"}


def tiny_config(name: str) -> tuple[list[str], list[str]]:
    """(FIXTURE_ARGS, TRAIN_ARGS with its OPTIMISATIONS) of ``config_cpu_tiny.sh``, as
    run_and_time.sh sees them."""
    script = (f'OPTIMISATIONS=(); source benchmarks/{name}/config_cpu_tiny.sh; '
              f'printf "%s\\n" "${{FIXTURE_ARGS[@]}}"; echo ---; '
              f'printf "%s\\n" "${{TRAIN_ARGS[@]}}"; echo ---; '
              f'(IFS=,; echo "${{OPTIMISATIONS[*]}}")')
    out = subprocess.run(["bash", "-c", script], cwd=REPO, capture_output=True, text=True,
                         check=True, env={"PATH": "/usr/bin:/bin"}).stdout
    fixture, train, opts = out.split("---\n")
    train = [x for x in train.splitlines() if x]
    if opts.strip():
        train += ["--optimisations", opts.strip()]
    return [x for x in fixture.splitlines() if x], train


@pytest.fixture(scope="module", params=WORKLOADS)
def tiny(request):
    """(workload class, argv) of the tiny config on the shared fixture cache."""
    name = request.param
    fixture_args, train_args = tiny_config(name)
    data = REPO / ".fixtures" / name
    proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}.fixture", str(data),
                           *fixture_args], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return workload_class(name), [*train_args, *FASTER.get(name, []), "--data-dir", str(data),
                                  "--seed", "5"]


def build(cls, argv: list[str], seed: int = 1):
    torch.manual_seed(seed)
    args = build_parser(cls).parse_args(argv)
    wl = cls(args, DistEnv(), Precision(args.precision, "cpu"))
    wl.setup()
    return wl


def ruleset_records(name: str, opt_name: str | None) -> list[dict]:
    files = ["common.yaml", "closed_common.yaml", f"closed_{name}.yaml"]
    if opt_name and (RULES / f"closed_{name}_{opt_name}.yaml").is_file():   # resnet: lars/sgd
        files.append(f"closed_{name}_{opt_name}.yaml")
    return [r for f in files for r in yaml.safe_load((RULES / f).read_text())]


def ruleset_tensors(records: list[dict]) -> list[str] | None:
    for r in records:
        check = str(r.get("END", {}).get("CHECK", ""))
        if "initialized_tensors" in check:
            return ast.literal_eval(re.search(r"sorted\((\[.*?\])\)\s*$", check, re.S).group(1))
    return None


def test_logs_every_required_key_once_and_the_rulesets_tensors(tiny, tmp_path):
    cls, argv = tiny
    wl = build(cls, argv)
    log = MLLog(tmp_path / "log.txt")
    log_workload(log, wl)
    log.close()
    events = read_events(tmp_path / "log.txt")
    keys = [e["key"] for e in events if e["key"] != "weights_initialization"]
    hp = wl.hyperparameters()
    records = ruleset_records(cls.name, hp.get("opt_name"))
    required = {r["KEY"]["NAME"] for r in records
                if "KEY" in r and r["KEY"].get("REQ") == "EXACTLY_ONE"} - DRIVER_KEYS
    for key in sorted(required):
        assert keys.count(key) == 1, f"{cls.name}: {key} logged {keys.count(key)} times"
    tensors = [e["metadata"]["tensor"] for e in events if e["key"] == "weights_initialization"]
    assert tensors == list(wl.initialized_tensors()) and len(set(tensors)) == len(tensors)
    expected = ruleset_tensors(records)
    if expected is not None and wl.args.submission_division == "closed":
        assert sorted(tensors) == sorted(expected)
    elif expected is not None:   # a smaller model for the open-division fixture: same names
        assert set(tensors) <= set(expected)


def test_two_steps_and_an_evaluation_the_target_predicate_judges(tiny):
    cls, argv = tiny
    wl = build(cls, argv)
    step = GraphedStep(wl.train_step, enabled=False)
    batches = iter(wl.epoch_batches(1))
    for _ in range(2):
        assert torch.isfinite(step(*next(batches))).all()
    with torch.no_grad():
        metrics = wl.evaluate()
    assert {t.metric for t in wl.targets} <= set(metrics)
    assert all(isinstance(v, float) for v in metrics.values())
    assert isinstance(wl.has_reached_target(metrics), bool)
    accuracy = wl.eval_accuracy(metrics)
    assert isinstance(accuracy, dict if len(wl.targets) > 1 else float)
    points = wl.eval_points()
    assert points and all(a.step < b.step for a, b in zip(points, points[1:]))


@pytest.fixture
def deterministic():
    """CPU kernels without races: ``index_put_`` with accumulation (the backward of the
    reference RoIAlign's gathers) adds with atomics across threads unless deterministic
    algorithms are on, so two identical runs differ in the last bits."""
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(False)


def test_init_steps_leave_training_bit_identical(tiny, deterministic):
    cls, argv = tiny
    states = []
    for init_steps in (0, 2):
        wl = build(cls, argv)
        step = GraphedStep(wl.train_step, enabled=False)
        if init_steps:
            warm_up(wl, step, init_steps, wl.env)
        batches = iter(wl.epoch_batches(1))
        for _ in range(2):
            step(*next(batches))
        states.append([t.detach().clone() for t in wl.training_state()])
    assert len(states[0]) == len(states[1])
    for a, b in zip(*states):
        assert torch.equal(a, b)


def _compile_flags(cls, argv: list[str]) -> list[str]:
    """``argv`` with compile on: the ``compile`` optimisation added to the named ones where
    the workload has a registry, else ``--compile default``."""
    if not len(cls.optimisations):
        return [*argv, "--compile", "default"]
    if "--optimisations" not in argv:
        return [*argv, "--optimisations", "compile"]
    i = argv.index("--optimisations") + 1
    return [*argv[:i], argv[i] + ",compile", *argv[i + 1:]]


def test_compile_is_honoured_or_refused(tiny, monkeypatch):
    """Compile on (``--compile default``, or the registry's ``compile``) puts the training
    step's work through ``torch.compile``, or the workload refuses it in one line: never
    silently ignored. ``torch.compile`` is replaced by a spy that runs the function eagerly
    and counts its calls (nothing compiles): one step with compile on calls compiled code
    more often than one step without (the fused kernels some workloads always compile count
    in both)."""
    import common.fusion

    cls, argv = tiny
    if not cls.compiles and len(cls.optimisations):
        assert "compile" not in cls.optimisations
        with pytest.raises(SystemExit):   # an unknown optimisation: a parse error
            build(cls, _compile_flags(cls, argv))
        return
    if not cls.compiles:
        with pytest.raises(UserError, match=rf"--compile default: {cls.name} has no "
                                            r"torch.compile path; leave --compile out"):
            build(cls, [*argv, "--compile", "default"])
        return
    calls = []

    def spy(fn=None, **kwargs):
        if fn is None:   # used as @torch.compile(...)
            return lambda f: spy(f, **kwargs)
        if isinstance(fn, torch.nn.Module):
            fn.register_forward_pre_hook(lambda *_: calls.append(fn))
            return fn

        def run(*args, **kw):
            calls.append(fn)
            return fn(*args, **kw)
        return run

    monkeypatch.setattr(torch, "compile", spy)
    # common.fusion keeps what it compiled for the process: spied functions must not stay
    monkeypatch.setattr(common.fusion, "_compiled", {})
    monkeypatch.setattr(common.fusion, "_static", {})
    counts = []
    for args in (argv, _compile_flags(cls, argv)):
        calls.clear()
        wl = build(cls, args)
        step = GraphedStep(wl.train_step, enabled=False)
        step(*next(iter(wl.epoch_batches(1))))
        counts.append(len(calls))
    assert counts[1] > counts[0], f"{cls.name}: compile on called compiled code {counts[1]} " \
                                  f"times in a step, off {counts[0]}"
