"""Every registered optimisation of every workload against the plain reference path.

For each optimisation (with what it requires) the tiny config is built twice from the same
seed, plain and optimised, and compared as the optimisation says (``Optimisation.compare``):
``step``, the losses of three training steps on the same synthetic batch (so the first
loss checks the forward and the next two the gradients and the update), within its
``rtol``; ``batches``, the first training batch of the same seed, within its ``atol``.
Optimisations that need CUDA run marked ``gpu`` on the device; on the CPU the plain path is
the reference there too. Every requirement and exclusion is refused in one line. A new
optimisation is covered by registering it.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from common.bench.worker import workload_class
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from common.training import build_parser
from tests.benchmarks.test_contract import FASTER, REPO, WORKLOADS, tiny_config

STEPS = 3
CASES = [(name, opt.name) for name in WORKLOADS
         for opt in workload_class(name).optimisations]


def _mark(name: str, opt: str):
    o = workload_class(name).optimisations[opt]
    reqs = workload_class(name).optimisations.closure([opt])
    # compiling a whole model's step on CI's two cores takes many minutes (ResNet-50: about
    # 35): compiled optimisations are compared on the GPU, where they are used
    cuda = any(workload_class(name).optimisations[r].cuda for r in reqs) or "compile" in reqs
    marks = [pytest.mark.gpu,
             pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")] if cuda \
        else []
    if o.compare is None:
        marks.append(pytest.mark.skip(reason=f"compared by {o.tested_by}"))
    return pytest.param(name, opt, marks=marks, id=f"{name}-{opt}")


_argv: dict[str, list[str]] = {}


def tiny_argv(name: str) -> list[str]:
    """The tiny config's flags on the shared fixture cache (written once per session), without
    the optimisations it names: the plain build is the reference path."""
    if name not in _argv:
        fixture_args, train_args = tiny_config(name)
        if "--optimisations" in train_args:
            i = train_args.index("--optimisations")
            train_args = train_args[:i] + train_args[i + 2:]
        data = REPO / ".fixtures" / name
        proc = subprocess.run([sys.executable, "-m", f"benchmarks.{name}.fixture", str(data),
                               *fixture_args], cwd=REPO, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        _argv[name] = [*train_args, *FASTER.get(name, []), *SMALLER.get(name, []),
                       "--data-dir", str(data), "--seed", "5", "--precision", "fp32"]
    return _argv[name]


# RNN-T's plain path runs the joint and the loss over the whole padded grid: at the tiny
# config's 16 utterances three CPU steps take most of a minute, at 4 a quarter of it
SMALLER = {"rnnt": ["--batch-size", "4"]}
_plain_losses: dict[tuple[str, str], list[float]] = {}


def plain_losses(name: str, device: str) -> list[float]:
    """``losses`` of the plain build, once per workload and device: every case compares
    against the same reference."""
    if (name, device) not in _plain_losses:
        wl = build(name, [], device)
        try:
            _plain_losses[name, device] = losses(wl)
        finally:
            wl.close()
    return _plain_losses[name, device]


def build(name: str, items: list[str], device: str):
    cls = workload_class(name)
    argv = [*tiny_argv(name), "--device", device] + (["--opt", ",".join(items)] if items else [])
    torch.manual_seed(1)
    args = build_parser(cls).parse_args(argv)
    wl = cls(args, DistEnv(device=torch.device(device)), Precision(args.precision, device))
    wl.setup()
    return wl


def losses(wl) -> list[float]:
    torch.manual_seed(2)
    batch = wl.warm_up_batches(wl.rank_batch_size)[0]
    torch.manual_seed(3)
    return [float(wl.train_step(*batch)) for _ in range(STEPS)]


def tensors(x) -> list[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        return [x]
    if isinstance(x, dict):
        return [t for v in x.values() for t in tensors(v)]
    if isinstance(x, (list, tuple)):
        return [t for v in x for t in tensors(v)]
    return [t for v in vars(x).values() for t in tensors(v)] if hasattr(x, "__dict__") else []


@pytest.fixture
def strict_fp32():
    """fp32 on the GPU without TF32 (cuDNN takes it for convolutions by default): both paths
    then round alike to fp32, and the tolerances hold for the optimisation, not for TF32."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


@pytest.mark.parametrize("name, opt", [_mark(*c) for c in CASES])
def test_optimisation_computes_what_the_plain_path_does(name, opt, strict_fp32):
    registry = workload_class(name).optimisations
    o = registry[opt]
    device = "cuda" if torch.cuda.is_available() and any(
        registry[r].cuda or r == "compile" for r in registry.closure([opt])) else "cpu"
    items = registry.closure([opt])
    if o.compare == "step":
        a = plain_losses(name, device)
        fast = build(name, items, device)
        try:
            b = losses(fast)
        finally:
            fast.close()
        assert all(map(lambda v: v == v, a)), a
        torch.testing.assert_close(b, a, rtol=max(registry[r].rtol for r in items),
                                   atol=max(registry[r].atol for r in items))
        return
    plain, fast = build(name, [], device), build(name, items, device)
    try:
        a = tensors(next(iter(plain.epoch_batches(1))))
        b = tensors(next(iter(fast.epoch_batches(1))))
        assert a and len(a) == len(b)
        for x, y in zip(a, b):
            torch.testing.assert_close(y.float().cpu(), x.float().cpu(), rtol=0, atol=o.atol)
    finally:
        plain.close()
        fast.close()


RULES = [(name, o.name, kind, other) for name in WORKLOADS
         for o in workload_class(name).optimisations
         for kind, others in (("requires", o.requires), ("excludes", o.excludes))
         for other in others]


@pytest.mark.parametrize("name, opt, kind, other", RULES,
                         ids=[f"{n}-{o}-{k}-{x}" for n, o, k, x in RULES])
def test_impossible_combinations_are_refused_in_one_line(name, opt, kind, other):
    registry = workload_class(name).optimisations
    if kind == "requires":   # opt first, so that its missing requirement is the one named
        chosen = [opt] + [n for n in registry.closure([opt]) if n not in (opt, other)]
    else:
        chosen = registry.closure([opt]) + registry.closure([other])
    with pytest.raises(UserError) as exc:
        registry.parse([",".join(chosen)])
    assert opt in str(exc.value) and other in str(exc.value) and "\n" not in str(exc.value)


def test_every_workload_with_a_registry_is_covered():
    assert all(name in WORKLOADS for name in {c[0] for c in CASES})
