"""The Mask R-CNN workload: the reference's LR schedule and optimizer groups, a training step
that learns, the plain step's losses and gradients with the optimisations (``--opt``), a
picklable scorer of both targets, and backbone checkpoints: loaded with the optimisations,
one-line errors for bad ones."""

import bisect
import pickle

import pytest
import torch

from benchmarks.maskrcnn import before_sync
from benchmarks.maskrcnn.detector import ground_truth
from benchmarks.maskrcnn.frozen_bn import folded_conv_bn
from benchmarks.maskrcnn.model import FrozenBatchNorm2d
from benchmarks.maskrcnn.roi_align import rois_from_boxes
from benchmarks.maskrcnn.workload import MaskRCNNWorkload, lr_at, score
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from common.training import build_parser
from tests.benchmarks.maskrcnn.test_frozen_bn import random_statistics
from tests.benchmarks.maskrcnn.test_model import torchvision_resnet50_state_dict

TINY = ["--synthetic-data", "--device", "cpu", "--precision", "fp32", "--width", "4",
        "--fpn-channels", "8", "--box-head-dim", "16", "--mask-head-dim", "8",
        "--min-size", "64", "--max-size", "64", "--batch-size", "2",
        "--rpn-pre-nms-top-n-train", "50", "--rpn-post-nms-top-n-train", "50",
        "--rpn-fpn-post-nms-top-n-train", "1000", "--rpn-batch-size-per-image", "32",
        "--roi-batch-size-per-image", "32", "--lr", "0.02", "--warmup-steps", "2"]
SWITCHES = [["--opt", "fold-frozen-bn"], ["--opt", "channels-last"],
            ["--opt", "fold-frozen-bn,channels-last"], ["--opt", "aligned-outputs"]]


def build(argv):
    torch.manual_seed(0)
    args = build_parser(MaskRCNNWorkload).parse_args(argv)
    wl = MaskRCNNWorkload(args, DistEnv(), Precision("fp32", "cpu"))
    wl.setup()
    return wl


def reference_lr(it, base, warmup_iters, warmup_factor, milestones):
    """``WarmupMultiStepLR.get_lr`` (linear warm-up, gamma 0.1) at iteration ``it``."""
    factor = 1.0
    if it < warmup_iters:
        alpha = it / warmup_iters
        factor = warmup_factor * (1 - alpha) + alpha
    return base * factor * 0.1 ** bisect.bisect_right(milestones, it)


def test_lr_is_the_references_warmup_multistep():
    for it in [0, 1, 249, 250, 499, 500, 501, 59999, 60000, 79999, 80000, 90000]:
        got = lr_at(torch.tensor(float(it)), 0.12, 500, 1 / 3, [60000, 80000]).item()
        assert got == pytest.approx(reference_lr(it, 0.12, 500, 1 / 3, [60000, 80000]),
                                    rel=1e-5), it


def test_biases_train_at_twice_the_lr_without_weight_decay():
    wl = build(TINY)
    weights, biases = wl.optimizer.param_groups
    names = {id(p): n for n, p in wl.net.named_parameters()}
    assert all(names[id(p)].endswith("bias") for p in biases["params"])
    assert biases["weight_decay"] == 0 and weights["weight_decay"] == 1e-4
    frozen = {id(p) for p in wl.net.backbone.layer1.parameters()}
    assert not frozen & {id(p) for g in wl.optimizer.param_groups for p in g["params"]}
    wl.train_step(*wl.synthetic_batch(2))
    assert biases["lr"].item() == pytest.approx(2 * weights["lr"].item())


def test_training_steps_reduce_the_loss_on_a_batch():
    wl = build(TINY)
    batch = wl.synthetic_batch(2)
    losses = [wl.train_step(*batch).item() for _ in range(8)]
    assert losses[-1] < 0.8 * losses[0], losses


@pytest.mark.parametrize("switches", SWITCHES)
def test_switches_compute_the_plain_steps_losses_and_gradients(switches):
    plain, fast = build(TINY), build(TINY + switches)
    g = torch.Generator().manual_seed(3)
    for m in plain.net.modules():
        if isinstance(m, FrozenBatchNorm2d):
            random_statistics(m, g)
    assert list(fast.net.state_dict()) == list(plain.net.state_dict())
    assert fast.tensor_names == plain.tensor_names
    fast.net.load_state_dict(plain.net.state_dict())
    batch = plain.synthetic_batch(2)
    layouts = []
    fast.net.fpn.register_forward_hook(lambda _m, inputs, levels: layouts.extend(   # C2..P5
        x.is_contiguous(memory_format=torch.channels_last) for x in [*inputs[0], *levels[:4]]))
    fast.net.backbone.register_forward_pre_hook(lambda _m, inputs: layouts.append(
        inputs[0].is_contiguous(memory_format=torch.channels_last)))
    losses, grads = [], []
    for wl in (plain, fast):
        wl.detector.register_forward_hook(lambda _m, _inputs, out: losses.append(out))
        torch.manual_seed(1)                    # the same anchors and RoIs sampled
        wl.train_step(*batch)
        grads.append({n: p.grad for n, p in wl.net.named_parameters()})
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-4, atol=1e-6)
    assert losses[0]["loss_mask"] > 0
    assert grads[1].keys() == grads[0].keys()
    for name, grad in grads[0].items():
        if grad is None:                        # frozen: the stem and layer1
            assert name.startswith(("backbone.conv1.", "backbone.layer1.")), name
            assert grads[1][name] is None, name
        else:
            torch.testing.assert_close(grads[1][name], grad, rtol=1e-3,
                                       atol=1e-4 * grad.abs().max().item(), msg=name)
    folded = fast.net.backbone.layer2[0].conv_bn is folded_conv_bn
    assert folded == ("fold-frozen-bn" in switches[1])
    channels_last = "channels-last" in switches[1]
    assert len(layouts) == 1 + 4 + 4 and all(cl == channels_last for cl in layouts)


@pytest.mark.parametrize("switches", SWITCHES)
def test_a_torchvision_backbone_checkpoint_loads_with_the_switches(tmp_path, switches):
    state = torchvision_resnet50_state_dict()
    path = tmp_path / "resnet50.pt"
    torch.save(state, path)
    wl = build([*TINY, "--width", "64", "--backbone-checkpoint", str(path), *switches])
    own = wl.net.backbone.state_dict()
    assert len(own) == 53 + 53 * 4
    assert all(torch.equal(value, state[key]) for key, value in own.items())
    weight = wl.net.backbone.layer4[0].conv2.weight
    assert weight.is_contiguous(memory_format=torch.channels_last) == (
        "channels-last" in switches[1])


def test_score_names_both_targets_and_pickles_for_background_scoring():
    assert pickle.loads(pickle.dumps(MaskRCNNWorkload.scorer)) is score
    assert {t.metric for t in MaskRCNNWorkload.targets} == {"BBOX", "SEGM"}
    wl = MaskRCNNWorkload.__new__(MaskRCNNWorkload)
    metrics = {"BBOX": 0.4, "SEGM": 0.35}
    assert wl.eval_accuracy(metrics) == metrics and wl.has_reached_target(metrics)
    assert not wl.has_reached_target({"BBOX": 0.5, "SEGM": 0.3})


@pytest.mark.parametrize("content", [b"not a checkpoint", {"weights": [1, 2]},
                                     {"conv.weight": torch.zeros(1)}])
def test_a_bad_backbone_checkpoint_is_one_line(tmp_path, content):
    path = tmp_path / "weights.pt"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        torch.save(content, path)
    with pytest.raises(UserError, match="resnet50") as e:
        build([*TINY, "--backbone-checkpoint", str(path)])
    assert str(path) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("opt", ["nms-triton", "roi-align-triton", "loss-streams",
                                 "fold-frozen-bn,fused-conv-relu"])
def test_cuda_optimisations_off_cuda_are_one_line(opt):
    name = opt.split(",")[-1]
    with pytest.raises(UserError, match=f"optimisation {name} needs CUDA: run with --device "
                                        "cuda") as e:
        build([*TINY, "--opt", opt])
    assert "\n" not in str(e.value)


def parse_error(argv, capsys) -> str:
    """The parser's one-line error for ``argv`` (exit 2)."""
    with pytest.raises(SystemExit) as e:
        build_parser(MaskRCNNWorkload).parse_args(argv)
    err = capsys.readouterr().err.strip()
    assert e.value.code == 2 and "\n" not in err
    return err


@pytest.mark.parametrize("opt", ["fused-conv-relu", "space-to-depth"])
def test_fused_conv_relu_and_space_to_depth_without_folding_are_one_line(opt, capsys):
    assert f"optimisation {opt} requires fold-frozen-bn: add fold-frozen-bn" in parse_error(
        [*TINY, "--opt", opt], capsys)


MULTIPLES = ["box-roi-multiple=16", "mask-roi-multiple=16"]


@pytest.mark.parametrize("opts, message", [
    (["backbone-graphs"], "backbone-graphs requires compile: add compile"),
    (["backbone-graphs", "compile"], "optimisation backbone-graphs needs CUDA"),
    (["head-graphs", *MULTIPLES], "head-graphs requires compile: add compile"),
    (["head-graphs", "compile", *MULTIPLES], "optimisation head-graphs needs CUDA"),
    (["head-graphs", "compile", "mask-roi-multiple=16"],
     "head-graphs requires box-roi-multiple: add box-roi-multiple"),
    (["compile-losses"], "compile-losses requires compile: add compile"),
    (["compile-proposals"], "compile-proposals requires compile: add compile"),
])
def test_graphs_without_compile_cuda_or_roi_multiples_is_one_line(opts, message, capsys):
    argv = [*TINY, "--opt", ",".join(opts)]
    if "requires" in message:
        assert message in parse_error(argv, capsys)
    else:
        with pytest.raises(UserError, match=message) as e:
            build(argv)
        assert "\n" not in str(e.value)


@pytest.mark.parametrize("head", ["box", "mask"])
def test_padded_rois_take_the_plain_steps_losses_and_gradients(head):
    """``--box-roi-multiple`` and ``--mask-roi-multiple``: the head on padding RoIs besides
    its own (in training left out of the loss, in evaluation copies of the last RoI, their
    outputs dropped): the same losses, gradients and evaluation outputs."""
    plain, padded = build(TINY), build([*TINY, "--opt", f"{head}-roi-multiple=16"])
    seen = []
    getattr(padded.detector.net, f"{head}_predictor").register_forward_hook(
        lambda _m, inputs, _out: seen.append(len(inputs[0])))
    assert_same_step(plain, padded)
    assert seen and all(n % 16 == 0 for n in seen), seen
    rois = torch.tensor([[0, 1.0, 2.0, 30.0, 40.0], [1, 5.0, 5.0, 60.0, 33.0],
                         [1, 0.0, 9.0, 20.0, 63.0]])
    levels = [torch.randn(2, 8, 64 // s, 64 // s) for s in (4, 8, 16, 32)]
    with torch.no_grad():
        expected = getattr(plain.detector, f"{head}_head")(levels, rois)
        got = getattr(padded.detector, f"{head}_head")(levels, rois)
    assert seen[-1] == 16
    for g, e in zip(*(x if isinstance(x, tuple) else (x,) for x in (got, expected))):
        assert g.shape == e.shape
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("multiple", [[], ["box-roi-multiple=16"]])
def test_box_head_before_the_sync_takes_the_plain_steps_losses_and_gradients(multiple):
    """``box-head-before-sync``: the box head on the host's bound of the sampled RoIs
    (here both images' 32, or 2 x 32 rounded to 16s), its padding left out of the loss."""
    plain = build([*TINY, "--opt", ",".join(multiple)])
    early = build([*TINY, "--opt", ",".join([*multiple, "box-head-before-sync"])])
    seen = []
    for wl in (plain, early):
        wl.detector.net.box_predictor.register_forward_hook(
            lambda _m, inputs, _out: seen.append(len(inputs[0])))
    assert_same_step(plain, early)
    assert seen[1] == 64 and seen[0] <= 64, seen


@pytest.mark.parametrize("switches", [[], ["fold-frozen-bn", "channels-last",
                                           "aligned-outputs"]])
def test_backward_before_the_sync_takes_the_plain_steps_losses_and_gradients(switches):
    """``backward-before-sync``: the RPN's and box losses' backward queued before the
    sampler's sync, the rest after the mask loss: the same gradients, over two steps (the
    second from the first's updated weights)."""
    early_box = [*switches, "box-head-before-sync"]
    plain = build([*TINY, "--opt", ",".join(early_box)])
    early = build([*TINY, "--opt", ",".join([*early_box, "backward-before-sync"])])
    passes, net = [], early.detector.net
    for name, p in (("box", net.box_predictor.cls_score.weight),
                    ("mask", net.mask_predictor.mask_fcn_logits.weight),
                    ("fpn", net.fpn.layer_blocks[0].weight)):
        p.register_hook(lambda grad, name=name: passes.append(name))
    assert_same_step(plain, early)
    assert passes == ["box", "mask", "fpn"]     # the box head's first, the backbone's last
    assert not early.detector.pending_backward
    for wl in (plain, early):
        torch.manual_seed(2)
        wl.train_step(*plain.synthetic_batch(2))
    for (name, p), q in zip(plain.net.named_parameters(), early.net.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)


def test_backward_before_the_sync_without_the_early_box_head_or_with_ddp_is_one_line(capsys):
    assert "requires box-head-before-sync" in parse_error(
        [*TINY, "--opt", "backward-before-sync"], capsys)
    args = build_parser(MaskRCNNWorkload).parse_args(
        [*TINY, "--opt", "box-head-before-sync,backward-before-sync"])
    with pytest.raises(UserError, match="runs in one process only: drop it for 2 processes"):
        MaskRCNNWorkload(args, DistEnv(world_size=2), Precision("fp32", "cpu"))


def test_a_box_head_bound_below_the_sampled_count_stops_the_step(monkeypatch):
    early = build([*TINY, "--opt", "box-head-before-sync"])
    monkeypatch.setattr(before_sync, "box_rows", lambda *_sizes: 8)
    with pytest.raises(RuntimeError, match="more than the box head's bound of 8"):
        early.train_step(*early.synthetic_batch(2))


def assert_same_step(plain, other):
    """One training step of each on one synthetic batch, from the same weights and random
    draws: the same losses and gradients."""
    other.net.load_state_dict(plain.net.state_dict())
    batch, losses = plain.synthetic_batch(2), []
    for wl in (plain, other):
        torch.manual_seed(1)                # the same anchors and RoIs sampled
        losses.append(wl.train_step(*batch))
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-7)
    for (name, p), q in zip(plain.net.named_parameters(), other.net.parameters()):
        if p.grad is not None:
            torch.testing.assert_close(q.grad, p.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_fused_sgd_takes_the_plain_updates():
    """``fused-sgd``: after three steps (past the warm-up's first LR) from the same weights
    and random draws, the parameters equal the plain optimizer's to rounding."""
    plain, fused = build(TINY), build([*TINY, "--opt", "fused-sgd"])
    assert fused.optimizer.fused and not plain.optimizer.fused
    fused.net.load_state_dict(plain.net.state_dict())
    start = [p.detach().clone() for p in plain.net.parameters()]
    batch = plain.synthetic_batch(2)
    for wl in (plain, fused):
        for step in range(3):
            torch.manual_seed(1 + step)
            wl.train_step(*batch)
    moved = 0
    for (name, p), q, p0 in zip(plain.net.named_parameters(), fused.net.parameters(), start):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-6, msg=name)
        moved += not torch.equal(p, p0)
    assert moved > 10, moved


@pytest.mark.parametrize("opt", ["box-roi-multiple", "mask-roi-multiple"])
def test_negative_roi_multiple_is_one_line(opt, capsys):
    assert f"optimisation {opt}=-1: must be more than 0, not -1" in parse_error(
        [*TINY, "--opt", f"{opt}=-1"], capsys)


def build_cuda(argv):
    torch.manual_seed(0)
    args = build_parser(MaskRCNNWorkload).parse_args(
        [*argv, "--device", "cuda", "--precision", "fp32"])
    wl = MaskRCNNWorkload(args, DistEnv(device=torch.device("cuda")),
                          Precision("fp32", "cuda"))
    wl.setup()
    return wl


def same_steps(plain, fast, batches, steps: int = 6, grad_tol: float = 2e-3):
    """``steps`` training steps of both workloads over ``batches`` in turn, ``fast`` loaded
    with ``plain``'s weights before each: the same losses, gradients within ``grad_tol`` of
    their largest. Each step's losses and gradients are copied as it ends: where both workloads
    replay CUDA graphs, they share one memory pool, and the other's step overwrites them."""
    def copy(tensors):
        return [None if t is None else t.detach().clone() for t in tensors]

    losses = {}
    for wl in (plain, fast):
        wl.detector.register_forward_hook(
            lambda m, _inputs, out: losses.__setitem__(m, dict(zip(out, copy(out.values())))))
    for step in range(steps):
        fast.net.load_state_dict(plain.net.state_dict())
        grads = []
        for wl in (plain, fast):
            torch.manual_seed(1 + step)         # the same anchors and RoIs sampled
            wl.train_step(*batches[step % len(batches)])
            grads.append(copy(p.grad for p in wl.net.parameters()))
        assert any(g is not None for g in grads[0])
        torch.testing.assert_close(losses[fast.detector], losses[plain.detector],
                                   rtol=1e-5, atol=1e-6)
        for (name, _), p, q in zip(plain.net.named_parameters(), *grads):
            if p is not None:
                torch.testing.assert_close(q, p, rtol=0, atol=grad_tol * p.abs().max().item(),
                                           msg=lambda m, name=name: f"{name}: {m}")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("graph_opts", [["backbone-graphs"],
                                        ["backbone-graphs", "head-graphs"]])
def test_graphs_take_the_compiled_steps(graph_opts):
    """Three steps (warm-up, recording, replay) of each of two padded sizes, alternating, from
    the same weights at every step: the compiled step's losses and gradients (the GPU
    configs' optimisations; without channels-last the compiled backward failed a stride check,
    graphs or not). Gradients within 2e-3 of their largest: two runs of the compiled step
    alone differed by up to 7e-4 of it on the H100 (atomics)."""
    argv = [*TINY, "--size-buckets", "2", "--opt",
            ",".join(["compile", "fold-frozen-bn", "channels-last", *MULTIPLES])]
    argv[argv.index("--max-size") + 1] = "128"
    plain, graphs = build_cuda(argv), build_cuda([*argv, "--opt", ",".join(graph_opts)])
    batches = plain.warm_up_batches(2)[:2]
    assert batches[0].images.shape != batches[1].images.shape
    same_steps(plain, graphs, batches)
    # evaluation: the heads on each padded size twice (recording, replay), in inference
    graphs.net.load_state_dict(plain.net.state_dict())
    for wl in (plain, graphs):
        wl.detector.eval()
    with torch.no_grad():
        for batch in 2 * batches:
            rois = rois_from_boxes(ground_truth(batch.boxes, batch.labels, batch.masks)[0])
            outputs = []
            for wl in (plain, graphs):
                levels = wl.detector.levels_and_rpn(
                    wl.normalized(batch.images, batch.image_sizes))[0]
                # copied before the next graphed call frees them (in inference)
                boxes = [x.clone() for x in wl.detector.box_head(levels, rois)]
                outputs.append([*boxes, wl.detector.mask_head(levels, rois).clone()])
            for got, expected in zip(*outputs):
                torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_compiled_losses_and_proposals_take_the_graphed_steps_losses():
    """The GPU configs' step with ``compile-losses``, ``compile-proposals`` and
    ``box-head-before-sync`` against it without, from the same weights at each of 6 steps
    over two padded sizes, the random keys drawn as eager draws them (``fallback_random``):
    the same losses, gradients within 2e-3 of their largest."""
    argv = [*TINY, "--size-buckets", "2", "--opt", ",".join(
        ["compile", "fold-frozen-bn", "channels-last", "loss-streams", "nms-triton",
         "backbone-graphs", "head-graphs", *MULTIPLES])]
    argv[argv.index("--max-size") + 1] = "128"
    with torch._inductor.config.patch(fallback_random=True):
        plain = build_cuda(argv)
        fast = build_cuda([*argv, "--opt",
                           "compile-losses,compile-proposals,box-head-before-sync"])
        same_steps(plain, fast, plain.warm_up_batches(2)[:2])


def graphed_argv(*extra: str) -> list[str]:
    """The tiny config with the 8xH200 config's optimisations (before ``roi-align-triton``)
    and ``extra``, over two padded sizes."""
    argv = [*TINY, "--size-buckets", "2", "--opt", ",".join(
        ["compile", "fold-frozen-bn", "channels-last", "loss-streams", "nms-triton",
         "backbone-graphs", "head-graphs", *MULTIPLES, "compile-losses", "box-head-before-sync",
         "aligned-outputs", *extra])]
    argv[argv.index("--max-size") + 1] = "128"
    return argv


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_backward_before_the_sync_takes_the_graphed_steps_losses():
    """The GPU configs' step with ``backward-before-sync`` against it without (6 steps over
    two padded sizes, as above): the backward in two parts through the graphed regions."""
    argv = graphed_argv()
    with torch._inductor.config.patch(fallback_random=True):
        plain = build_cuda(argv)
        fast = build_cuda([*argv, "--opt", "backward-before-sync"])
        same_steps(plain, fast, plain.warm_up_batches(2)[:2])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_triton_roi_align_takes_the_graphed_steps_losses():
    """The 1xH100 config's step with ``roi-align-triton`` against it without (6 steps over
    two padded sizes, as above): both heads' pooling and its backward, compiled and graphed.
    Gradients within 2e-2 of their largest: the pooled features differ from the compiled
    reference's in fp32 rounding (by 4e-6 on the H100, where the compiled reference differs
    from the eager one by 7.5e-6), which flips a few ReLUs of this tiny mask head of about
    ten RoIs: its gradients moved by up to 5e-3 of their largest in one step of six. A wrong
    tap or level moves them by their whole size."""
    argv = graphed_argv("backward-before-sync")
    with torch._inductor.config.patch(fallback_random=True):
        plain = build_cuda(argv)
        fast = build_cuda([*argv, "--opt", "roi-align-triton"])
        same_steps(plain, fast, plain.warm_up_batches(2)[:2], grad_tol=2e-2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_fused_conv_relu_and_space_to_depth_take_the_graphed_steps_losses():
    """The 1xH100 config's step with ``fused-conv-relu`` against it without (6 steps over two
    padded sizes, as above): the same losses, gradients within 2e-3 of their largest (measured
    on the H100: the losses equal, the gradients within 2.8e-4; in fp32 the epilogue adds the
    bias to the same sums). Then with ``space-to-depth`` too, the graphed forward in
    inference: the same FPN levels and RPN outputs within 1e-5 of their largest. Its stem sums
    in another order, which flips near-tied proposals of this tiny untrained network, so its
    training steps' losses differ by up to 1.2e-2 (measured): not compared."""
    argv = graphed_argv("backward-before-sync", "roi-align-triton")
    with torch._inductor.config.patch(fallback_random=True):
        plain = build_cuda(argv)
        fast = build_cuda([*argv, "--opt", "fused-conv-relu"])
        batches = plain.warm_up_batches(2)[:2]
        same_steps(plain, fast, batches)
        s2d = build_cuda([*argv, "--opt", "fused-conv-relu,space-to-depth"])
    s2d.net.load_state_dict(plain.net.state_dict())
    # strict fp32, as the driver sets it for --precision fp32: with TF32 (PyTorch's default
    # for cuDNN) the two stems round differently
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        for batch in 2 * batches:     # each padded size recorded, then replayed
            outputs = []
            for wl in (plain, s2d):
                wl.detector.eval()
                levels, objectness, deltas = wl.detector.levels_and_rpn(
                    wl.normalized(batch.images, batch.image_sizes))
                outputs.append([x.clone() for x in (*levels, *objectness, *deltas)])
            for got, expected in zip(*outputs[::-1]):
                torch.testing.assert_close(got, expected, rtol=0,
                                           atol=1e-5 * expected.abs().max().item())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_loss_streams_compute_the_plain_steps_losses_and_gradients_on_three_streams():
    from torch.profiler import ProfilerActivity, profile

    plain, streams = build_cuda(TINY), build_cuda([*TINY, "--opt", "loss-streams"])
    streams.net.load_state_dict(plain.net.state_dict())
    batch = plain.synthetic_batch(2)
    losses, grads = {}, []
    for wl in (plain, streams):
        wl.detector.register_forward_hook(lambda m, _inputs, out: losses.__setitem__(m, out))
        for step in range(2):   # the second, warm step is profiled (the first creates state)
            torch.manual_seed(1 + step)         # the same anchors and RoIs sampled
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                wl.train_step(*batch)
                torch.cuda.synchronize()
        grads.append({n: p.grad for n, p in wl.net.named_parameters() if p.grad is not None})
        wl.kernel_streams = {e.device_resource_id for e in prof.events()
                             if e.device_type == torch.autograd.DeviceType.CUDA}
    torch.testing.assert_close(losses[streams.detector], losses[plain.detector], rtol=1e-5,
                               atol=1e-6)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4,
                                   atol=1e-5 * grad.abs().max().item(), msg=name)
    # the RPN, box and mask losses on three streams the plain step never uses
    assert len(streams.kernel_streams - plain.kernel_streams) >= 3, (
        plain.kernel_streams, streams.kernel_streams)


def test_warm_up_batches_take_every_padded_shape_of_the_buckets():
    assert [tuple(b.images.shape[-2:]) for b in build(TINY).warm_up_batches(2)] == [(64, 64)]
    argv = [*TINY, "--size-buckets", "2"]
    argv[argv.index("--max-size") + 1] = "128"
    wl = build(argv)
    assert wl.buckets == (64, 128)
    shapes = [tuple(b.images.shape[-2:]) for b in wl.warm_up_batches(2)]
    assert shapes == [(64, 64), (64, 128), (128, 64)]


@pytest.mark.parametrize("flags, message", [
    (["--lr-decay-steps", "80000,60000"], "--lr-decay-steps 80000,60000: give two rising steps"),
    (["--lr-decay-steps", "60000"], "--lr-decay-steps 60000: give two rising steps"),
    (["--min-size", "64", "--max-size", "32"], "--max-size 32 is less than --min-size 64"),
])
def test_schedule_and_sizes_that_make_no_sense_are_one_line(flags, message):
    with pytest.raises(UserError, match=message) as e:
        build([*TINY, *flags])
    assert "\n" not in str(e.value)
