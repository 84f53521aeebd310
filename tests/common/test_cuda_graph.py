import copy
import time

import pytest
import torch
import torch.multiprocessing as mp

from common.cuda_graph import GraphedStep, graphed_step
from common.errors import UserError
from common.workload import CapturePolicy
from tests.common.test_dist import _free_port, _rendezvous


def make_step(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def run(step_fn, batches):
    return torch.stack([step_fn(x, y).clone() for x, y in batches])


def models(device):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return a.to(device), copy.deepcopy(a).to(device)


def plain_and_graphed(device, warmup_steps, max_graphs=1, eager_beyond=False):
    """The same SGD step twice from the same weights: plain, and through GraphedStep."""
    a, b = models(device)
    plain = make_step(a, torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9))
    graphed = GraphedStep(make_step(b, torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)),
                          warmup_steps=warmup_steps, max_graphs=max_graphs,
                          eager_beyond=eager_beyond)
    return plain, graphed


def batches(device, n=15):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g).to(device), torch.randn(4, 1, generator=g).to(device))
            for _ in range(n)]


def test_eager_fallback_equals_plain_step():
    plain, graphed = plain_and_graphed("cpu", 2)
    data = batches("cpu")
    assert torch.equal(run(plain, data), run(graphed, data))
    assert not graphed.captured


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_graph_equals_eager_on_gpu():
    plain, graphed = plain_and_graphed("cuda", 3)
    data = batches("cuda")
    want, got = run(plain, data), run(graphed, data)
    assert graphed.captured
    torch.testing.assert_close(got, want)
    graphed.release()   # graphs destroyed; the step warms up and captures again
    assert not graphed.captured
    more = batches("cuda", 6)
    torch.testing.assert_close(run(graphed, more), run(plain, more))
    assert graphed.captured


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_graph_per_input_shape_on_gpu():
    plain, graphed = plain_and_graphed("cuda", 3, max_graphs=3)
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(n, 8, generator=g).cuda(), torch.randn(n, 1, generator=g).cuda())
            for n in (4, 4, 4, 4, 6, 4, 6, 2, 6, 4, 2)]
    want, got = run(plain, data), run(graphed, data)
    assert sorted(shapes[0][0] for _, shapes in graphed.graphs) == [2, 4, 6]
    torch.testing.assert_close(got, want)
    with pytest.raises(UserError, match="beyond its 3 CUDA graph"):
        graphed(torch.randn(5, 8).cuda(), torch.randn(5, 1).cuda())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_shapes_beyond_the_graphs_run_eagerly_where_the_policy_says_so():
    plain, graphed = plain_and_graphed("cuda", 2, max_graphs=2, eager_beyond=True)
    g = torch.Generator().manual_seed(3)
    data = [(torch.randn(n, 8, generator=g).cuda(), torch.randn(n, 1, generator=g).cuda())
            for n in (4, 4, 4, 6, 6, 2, 4, 2, 6, 5)]
    torch.testing.assert_close(run(graphed, data), run(plain, data))
    assert sorted(shapes[0][0] for _, shapes in graphed.graphs) == [4, 6]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_nested_batches_are_captured_and_replayed_on_gpu():
    """A batch of (dict of tensors, [tensor, list of variable-length tensors], None)."""
    a, b = models("cuda")

    def nested(step):
        def run_nested(inputs, targets, unused):
            y, boxes = targets
            return step(inputs["x"] + sum(t.sum() for t in boxes) * 0, y) * inputs["scale"]
        return run_nested
    plain = nested(make_step(a, torch.optim.SGD(a.parameters(), lr=0.1)))
    graphed = GraphedStep(nested(make_step(b, torch.optim.SGD(b.parameters(), lr=0.1))),
                          warmup_steps=2, max_graphs=3)   # 0, 1 or 2 boxes
    data = [({"x": x, "scale": torch.full((), 2.0, device="cuda")},
             [y, [torch.rand(i % 3, 4, device="cuda"), torch.rand(1, 4, device="cuda")]], None)
            for i, (x, y) in enumerate(batches("cuda", 12))]
    want = torch.stack([plain(*d).clone() for d in data])
    got = torch.stack([graphed(*d).clone() for d in data])
    assert graphed.captured
    torch.testing.assert_close(got, want)


def test_capture_policy_decides_graphs_and_refuses_uncapturable_fp16():
    model = torch.nn.Linear(2, 1)
    step = make_step(model, torch.optim.SGD(model.parameters(), lr=0.1))
    cuda = torch.device("cuda")
    with pytest.raises(UserError, match="amp-fp16 loss scaling .* add --no-cuda-graph"):
        graphed_step(step, CapturePolicy("static"), True, cuda, "amp-fp16", "toy")
    # never captured: no refusal, eager; off when not asked for or on the CPU
    assert not graphed_step(step, CapturePolicy("never"), True, cuda, "amp-fp16", "t").enabled
    assert not graphed_step(step, CapturePolicy("static"), False, cuda, "amp-fp16", "t").enabled
    cpu = graphed_step(step, CapturePolicy("bucketed", 4), True, torch.device("cpu"), "fp32", "t")
    assert not cpu.enabled and cpu.max_graphs == 4


def _ddp_graph_worker(rank, world, port, out):
    from common import dist
    from common.cuda_graph import DEFAULT_WARMUP_STEPS
    from common.streams import work_stream
    _rendezvous(rank, world, port)
    env = dist.init_distributed("cuda")
    with work_stream(env.device):
        torch.manual_seed(0)
        model = dist.data_parallel(torch.nn.Linear(8, 1).to(env.device), env)
        step = GraphedStep(make_step(model, torch.optim.SGD(model.parameters(), lr=0.1)))
        for x, y in batches("cuda", DEFAULT_WARMUP_STEPS + 3):
            step(x, y)
        assert step.captured   # DDP's all-reduce is inside the graph
        step.release()
    dist.shutdown()            # waits forever while such a graph lives (pytorch#115388)
    out[rank] = True


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 GPUs")
def test_released_graph_with_nccl_lets_the_process_group_close_on_two_gpus():
    with mp.Manager() as manager:
        out = manager.dict()
        ctx = mp.spawn(_ddp_graph_worker, args=(2, _free_port(), out), nprocs=2, join=False)
        start = time.monotonic()
        while not ctx.join(timeout=5):
            if time.monotonic() - start > 120:
                for p in ctx.processes:
                    p.kill()
                pytest.fail("the ranks did not close their process group within 120 s")
        assert dict(out) == {0: True, 1: True}
