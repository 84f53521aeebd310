"""Spatial parallelism over two gloo processes equals the single-process model and loss."""

import pytest
import torch
import torch.multiprocessing as mp

from benchmarks.unet3d import fused_norm, inference, spatial
from benchmarks.unet3d.loss import dice_ce_loss, dice_score
from benchmarks.unet3d.model import Unet3D
from common import dist
from tests.common.test_dist import _free_port, _rendezvous

FILTERS = (4, 8, 16, 32, 40)
SHAPE = (1, 1, 64, 32, 32)   # depth 64 over 2 ranks: one slice per rank at the bottleneck


def _inputs():
    torch.manual_seed(0)
    x = torch.randn(SHAPE, dtype=torch.float64).float()
    y = torch.randint(0, 3, SHAPE, dtype=torch.uint8)
    return x, y


ROI = (64, 32, 32)


def _eval_image() -> torch.Tensor:
    torch.manual_seed(2)
    return torch.randn(1, 1, 100, 50, 37)   # 2 x 2 x 1 windows after the crop


def _half(index: int) -> torch.Tensor:
    """Logits that differ between the two depth halves (and between classes)."""
    return torch.arange(3.0).view(1, 3, 1, 1, 1).expand(1, 3, 32, 32, 32) * (index - 0.5)


def _worker(rank, world, port, out):
    _rendezvous(rank, world, port)
    torch.set_num_threads(1)
    dist.init_distributed("cpu")
    sg = spatial.new_spatial_group(world)
    torch.manual_seed(1)
    net = Unet3D(FILTERS)
    x, y = _inputs()
    xs = sg.slab(x).clone().requires_grad_(True)
    model = spatial.spatial_parallel(net, sg)
    logits = model(xs)
    loss = spatial.spatial_loss(logits, sg.slab(y), sg)
    loss.backward()
    score = spatial.spatial_dice_score(logits.detach(), sg.slab(y), sg)
    soft = spatial.spatial_loss(_half(sg.index), sg.slab(y), sg)
    with torch.no_grad():
        windows = inference.sliding_window(net, _eval_image(), ROI, 0.5, 3, 2, rank, world)[0]
        fused = Unet3D(FILTERS)
        fused.load_state_dict(net.state_dict())
        split = spatial.spatial_parallel(fused, sg)
        fused_norm.fuse(split, swaps=spatial.FUSED)   # after the split, as the workload applies it
        assert any(type(m) is spatial.FusedSpatialInstanceNormReLU for m in split.modules())
        fused_logits = split(xs)
    # channels_last_3d activations: halos travel and land in that layout
    cl_net = Unet3D(FILTERS).to(memory_format=torch.channels_last_3d)
    cl_net.load_state_dict(net.state_dict())
    xc = xs.detach().contiguous(memory_format=torch.channels_last_3d).requires_grad_(True)
    cl_logits = spatial.spatial_parallel(cl_net, sg)(xc)
    spatial.spatial_loss(cl_logits, sg.slab(y), sg).backward()
    out[rank] = dict(windows=windows, fused_logits=fused_logits, cl_logits=cl_logits.detach(),
                     cl_x_grad=xc.grad, logits=logits.detach(), loss=loss.detach(), x_grad=xs.grad,
                     grads={n: p.grad.clone() for n, p in net.named_parameters()},
                     names=[n for n, _ in model.named_parameters()], score=score,
                     soft=soft.detach())
    dist.shutdown()


@pytest.fixture(scope="module")
def results():
    world = 2
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_worker, args=(world, _free_port(), out), nprocs=world, join=True)
        return dict(out)


@pytest.fixture(scope="module")
def reference():
    torch.manual_seed(1)
    net = Unet3D(FILTERS)
    x, y = _inputs()
    x.requires_grad_(True)
    logits = net(x)
    loss = dice_ce_loss(logits, y)
    loss.backward()
    return dict(net=net, logits=logits.detach(), loss=loss.detach(), x_grad=x.grad, y=y)


TOL = dict(rtol=1e-5, atol=1e-5)


def test_forward_matches_single_process(results, reference):
    logits = torch.cat([results[0]["logits"], results[1]["logits"]], dim=2)
    torch.testing.assert_close(logits, reference["logits"], **TOL)
    # The slices next to the split and at both volume ends, explicitly.
    for d in (0, 31, 32, 63):
        torch.testing.assert_close(logits[:, :, d], reference["logits"][:, :, d], **TOL)


def test_fused_norm_forward_matches_single_process(results, reference):
    logits = torch.cat([results[0]["fused_logits"], results[1]["fused_logits"]], dim=2)
    torch.testing.assert_close(logits, reference["logits"], rtol=1e-4, atol=1e-4)


def test_channels_last_forward_and_backward_match_single_process(results, reference):
    for key, want in (("cl_logits", reference["logits"]), ("cl_x_grad", reference["x_grad"])):
        got = torch.cat([results[0][key], results[1][key]], dim=2)
        torch.testing.assert_close(got, want, **TOL)


def test_loss_is_the_single_process_loss_on_every_rank(results, reference):
    for rank in (0, 1):
        torch.testing.assert_close(results[rank]["loss"], reference["loss"], **TOL)


def test_backward_matches_single_process(results, reference):
    x_grad = torch.cat([results[0]["x_grad"], results[1]["x_grad"]], dim=2)
    torch.testing.assert_close(x_grad, reference["x_grad"], **TOL)
    for d in (0, 31, 32, 63):
        torch.testing.assert_close(x_grad[:, :, d], reference["x_grad"][:, :, d], **TOL)
    for name, p in reference["net"].named_parameters():
        summed = results[0]["grads"][name] + results[1]["grads"][name]
        torch.testing.assert_close(summed, p.grad, **TOL, msg=name)
        assert p.grad.abs().max() > 0, name


def test_spatial_model_keeps_parameter_names(results, reference):
    assert results[0]["names"] == [n for n, _ in reference["net"].named_parameters()]


def test_spatial_dice_equals_plain_dice(results, reference):
    plain = dice_score(reference["logits"], reference["y"])
    for rank in (0, 1):
        torch.testing.assert_close(results[rank]["score"], plain)
    # Soft Dice + CE of logits that differ between the halves.
    expected = dice_ce_loss(torch.cat([_half(0), _half(1)], dim=2), reference["y"])
    for rank in (0, 1):
        torch.testing.assert_close(results[rank]["soft"], expected, **TOL)


def test_sharded_sliding_window_equals_single_process(results, reference):
    with torch.no_grad():
        whole, _ = inference.sliding_window(reference["net"], _eval_image(), ROI, 0.5, 3, 2)
    for rank in (0, 1):
        torch.testing.assert_close(results[rank]["windows"], whole, **TOL)
