"""``compile``: the networks' three compiled regions give the eager step's losses and
gradients on batches whose padded size changes; a new size compiles the backbone once and
the heads never again; the warm-up before the clock builds the training and evaluation
graphs. ``compile-losses``: the same losses, no graph per count.

The graph counts are Dynamo's, whatever the backend: those tests run on ``aot_eager``
(Inductor's C++ code generation takes minutes on the CPU); the last test runs Inductor over
every compiled region and checks its numerics."""

import pytest
import torch
from torch._dynamo.eval_frame import _debug_get_cache_entry_list
from torch._dynamo.utils import counters

from benchmarks.maskrcnn import data
from benchmarks.maskrcnn.detector import _mask_loss
from benchmarks.maskrcnn.roi_heads import box_loss
from benchmarks.maskrcnn.rpn import RPN
from common.cuda_graph import GraphedStep
from common.training import warm_up
from tests.benchmarks.maskrcnn.test_workload import TINY, build


@pytest.fixture
def aot_eager(monkeypatch):
    """``torch.compile`` on ``aot_eager``: Dynamo's graphs and AOTAutograd's forward and
    backward, run by eager kernels; the mode and Inductor options are dropped."""
    compile_ = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, dynamic=None, **_: compile_(
        fn, dynamic=dynamic, backend="aot_eager"))


def same_training(plain, compiled, batches):
    """A training step of both workloads on each batch: the same losses, then weights."""
    for batch in batches:
        losses = []
        for wl in (plain, compiled):
            torch.manual_seed(1)                # the same anchors and RoIs sampled
            losses.append(wl.train_step(*batch))
        torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
    for (name, p), q in zip(plain.net.named_parameters(), compiled.net.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-4, atol=1e-6, msg=name)


def test_compiled_regions_compute_the_eager_steps_losses_and_gradients(aot_eager):
    torch._dynamo.reset()
    counters.clear()
    plain, compiled = build(TINY), build([*TINY, "--opt", "compile"])
    compiled.net.load_state_dict(plain.net.state_dict())
    small = data.synthetic_batch(2, plain.num_classes, 64, 64)
    large = data.synthetic_batch(2, plain.num_classes, 96, 128)
    assert small.images.shape[-2:] != large.images.shape[-2:]
    same_training(plain, compiled, (small, large, small))
    # the backbone once per size, each head once for any
    assert counters["stats"]["unique_graphs"] == 4, dict(counters["stats"])


def test_the_warm_up_builds_the_training_and_evaluation_graphs(aot_eager):
    torch._dynamo.reset()
    counters.clear()
    wl = build([*TINY, "--opt", "compile"])
    warm_up(wl, GraphedStep(wl.train_step, enabled=False), 1, wl.env)
    assert counters["stats"]["unique_graphs"] == 6, dict(counters["stats"])  # train + infer
    wl.train_step(*data.synthetic_batch(2, wl.num_classes, 64, 64))   # the warm-up's size
    assert counters["stats"]["unique_graphs"] == 6, dict(counters["stats"])
    wl.train_step(*data.synthetic_batch(2, wl.num_classes, 96, 128))  # a new one: the backbone
    wl.detector.eval()
    with torch.no_grad():
        batch = data.synthetic_batch(3, wl.num_classes, 96, 128)
        wl.detector(wl.normalized(batch.images, batch.image_sizes), batch.image_sizes,
                    batch.image_sizes)
    assert counters["stats"]["unique_graphs"] == 8, dict(counters["stats"])


@pytest.mark.parametrize("opts", ["compile", "compile,compile-proposals"])
def test_a_short_evaluation_batch_runs_the_warmed_up_graphs(opts, aot_eager):
    torch._dynamo.reset()
    counters.clear()
    plain, compiled = build(TINY), build([*TINY, "--opt", opts])
    compiled.net.load_state_dict(plain.net.state_dict())
    warm_up(compiled, GraphedStep(compiled.train_step, enabled=False), 1, compiled.env)
    graphs = counters["stats"]["unique_graphs"]
    count = compiled.args.eval_batch_size - 1
    t = data.synthetic_batch(count, compiled.num_classes, 64, 64)      # the warm-up's size
    batch = data.EvalBatch(t.images, t.image_sizes, torch.arange(count), t.image_sizes)
    with torch.no_grad():
        for wl in (plain, compiled):
            wl.detector.eval()
        got, expected = compiled.detect(batch), plain.detect(batch)
    assert counters["stats"]["unique_graphs"] == graphs, dict(counters["stats"])
    assert len(got) == len(expected) == count
    for g, e in zip(got, expected):
        assert torch.equal(g.labels, e.labels)
        torch.testing.assert_close(g.boxes, e.boxes, rtol=1e-4, atol=1e-3)


def test_a_filled_evaluation_batch_repeats_its_last_image():
    t = data.synthetic_batch(2, 5, 64, 64)
    batch = data.EvalBatch(t.images, t.image_sizes, torch.tensor([7, 9]), t.image_sizes)
    filled = batch.filled(4)
    assert filled.image_ids.tolist() == [7, 9, 9, 9]
    assert torch.equal(filled.images[:2], batch.images)
    assert torch.equal(filled.images[3], batch.images[1])
    assert filled.original_sizes.shape == (4, 2)
    assert batch.filled(2) is batch


def _losses_trained(batches, fallback_random=False):
    """The plain and the ``compile-losses,compile-proposals`` workloads trained on
    ``batches`` from the same weights: the same losses, then weights."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fallback_random=fallback_random):
        plain = build(TINY)
        compiled = build([*TINY, "--opt", "compile,compile-losses,compile-proposals"])
        compiled.net.load_state_dict(plain.net.state_dict())
        same_training(plain, compiled, [
            data.synthetic_batch(2, plain.num_classes, height, width, objects=objects)
            for objects, height, width in batches])
    return {fn.__name__: len(_debug_get_cache_entry_list(fn.__code__))
            for fn in (RPN.loss, box_loss, _mask_loss, RPN._candidates, RPN._select)}


def test_compiled_losses_and_proposals_compile_once_per_padded_size(aot_eager):
    """``compile-losses`` and ``compile-proposals`` over five batches of two padded sizes and 2
    to 6 objects an image: the RPN and mask losses and the proposal selection compiled once
    per padded size and the box loss once, whatever the counts (Dynamo's graphs; the eager
    step's losses and weights too)."""
    graphs = _losses_trained([(4, 64, 64), (4, 96, 128), (2, 64, 64), (6, 96, 128),
                              (3, 64, 64)])
    assert graphs["loss"] == graphs["_candidates"] == graphs["_select"] == 2, graphs
    assert graphs["box_loss"] == 1 and graphs["_mask_loss"] == 2, graphs


def test_compiled_losses_and_proposals_compute_the_eager_losses_under_inductor():
    """The same regions through Inductor (drawing the anchors' and RoIs' random keys as eager
    does: ``fallback_random``) give the eager step's losses and weights over three batches of
    2 to 6 objects an image, one padded size (Inductor's C++ code generation takes minutes a
    size on the CPU). The CPU code generator may guard the mask loss on the positive count (a
    reduction of more than 4,096 elements): one more graph at most."""
    graphs = _losses_trained([(4, 64, 64), (2, 64, 64), (6, 64, 64)], fallback_random=True)
    assert graphs["loss"] == graphs["_candidates"] == graphs["_select"] == 1, graphs
    assert graphs["box_loss"] == 1 and 1 <= graphs["_mask_loss"] <= 2, graphs
