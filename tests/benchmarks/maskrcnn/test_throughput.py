"""The Mask R-CNN throughput tool on the CPU: its errors, a failing variant that does not stop
it, ours' variants (the registry's ablation of the 1xH100 config), the batch as torchvision
takes it and the FLOPs counted on the plain step."""

import json

import pytest
import torch

from benchmarks.maskrcnn import data, throughput
from benchmarks.maskrcnn.frozen_bn import folded_conv_bn
from benchmarks.maskrcnn.topk import ordered_topk
from common import throughput as common_throughput
from common.mfu import COUNTED, MFU
from common.optimisations import config_optimisations
from common.precision import Precision
from common.throughput import Measurement
from tests.benchmarks.maskrcnn.test_workload import TINY, build
from tests.benchmarks.test_configs import REPO, config_args
from tests.entry_points import assert_needs_cuda


def test_without_cuda_exits_2_with_one_line():
    assert_needs_cuda("benchmarks.maskrcnn.throughput")


def test_unknown_variant_exits_2_with_one_line(monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        throughput.main(["--variants", "config,torchvision-jit"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(err) == 1 and "['torchvision-jit']" in err[0]


def test_a_failing_variant_is_reported_and_the_others_still_run(monkeypatch, capsys, tmp_path):
    def torchvision_step(batch, precision, device, compiled):
        def step(*_batch):
            if compiled:
                raise RuntimeError("Dynamo failed to run FX node\nthe long trace")
        return step

    def time_steps(name, step, batch, device, warmup, iters):
        step(*batch)
        return Measurement(name, len(batch.images), iters, 2.0, 0)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda: "fake GPU")
    monkeypatch.setattr(data, "synthetic_batch", lambda n, c, device: data.collate_train(
        [(torch.zeros(3, 32, 32), torch.tensor([[1.0, 2, 9, 9]]), torch.tensor([1]),
          torch.ones(1, 32, 32, dtype=torch.uint8))] * n))
    monkeypatch.setattr(throughput, "torchvision_step", torchvision_step)
    monkeypatch.setattr(common_throughput, "time_steps", time_steps)
    monkeypatch.setattr(MFU, "measure", classmethod(lambda cls, plain, device: cls(
        1e9, COUNTED, 100.0)))
    report = tmp_path / "report.json"
    assert throughput.main(["--variants", "torchvision-compile,torchvision-eager",
                            "--batch-size", "2", "--iters", "10", "--json", str(report)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("MFU: 1.00 GFLOP per sample (counted at this batch)")
    assert out[1].split() == ["torchvision-compile", "failed:", "RuntimeError:", "Dynamo",
                              "failed", "to", "run", "FX", "node"]
    assert out[2].startswith("torchvision-eager") and "img/s, MFU  0.0%" in out[2]
    rows = json.loads(report.read_text())["results"]
    assert rows[0] == {"variant": "torchvision-compile", "batch_size": 2,
                       "precision": "amp-bf16",
                       "error": "RuntimeError: Dynamo failed to run FX node"}
    assert rows[1]["variant"] == "torchvision-eager" and rows[1]["samples_per_second"] == 10
    assert rows[1]["mfu"] == pytest.approx(1e-4) and rows[1]["flops_from"] == COUNTED


def test_the_variants_are_the_configs_ablation_and_config_is_its_step():
    """``config`` names the 1xH100 config's optimisations, with the config's proposals and
    size buckets (``CONFIG_HPARAMS``, checked against the config's TRAIN_ARGS);
    ``config-minus-compile`` drops what requires ``compile``."""
    variants = throughput.ours_variants()
    config = set(config_optimisations("maskrcnn", "1xH100"))
    assert variants["plain"] == [] and set(variants["config"]) == config
    assert {"fold-frozen-bn", "space-to-depth", "fused-conv-relu", "backward-before-sync",
            "box-roi-multiple=512", "mask-roi-multiple=128"} <= config
    assert set(variants["config-minus-compile"]) == config - {
        "compile", "compile-losses", "backbone-graphs", "head-graphs"}
    assert len(variants) == 2 + len(config)
    _, train_args = config_args(REPO / "benchmarks/maskrcnn/config_1xH100.sh")
    hparams = dict(zip(throughput.CONFIG_HPARAMS[::2], throughput.CONFIG_HPARAMS[1::2]))
    assert all(train_args[train_args.index(flag) + 1] == value
               for flag, value in hparams.items())


@pytest.mark.parametrize("optimisations", [[], ["topk-chunks", "channels-last",
                                                "fold-frozen-bn"]])
def test_ours_builds_the_workload_with_its_optimisations_at_the_training_size(optimisations):
    wl, batch = throughput.ours(optimisations, 1, Precision("fp32", "cpu"), torch.device("cpu"))
    assert wl.args.synthetic_data and wl.hp.batch_size == 1
    assert list(wl.opts) == optimisations
    assert (wl.detector.rpn.topk is not ordered_topk) == bool(optimisations)
    assert (wl.net.backbone.layer1[0].conv_bn is folded_conv_bn) == bool(optimisations)
    assert (wl.memory_format == torch.channels_last) == bool(optimisations)
    assert wl.hp.rpn_fpn_post_nms_top_n_train == 6000 and wl.hp.size_buckets == 4
    assert batch.image_sizes.tolist() == [[800, 1066]] and batch.images.shape[-2:] == (800, 1088)


def test_torchvision_inputs_are_each_image_at_its_size_with_its_own_targets():
    g = torch.Generator().manual_seed(0)
    samples = []
    for (h, w), n in [((40, 56), 3), ((64, 36), 1)]:
        corner = torch.randint(0, 20, (n, 2), generator=g).float()
        boxes = torch.cat((corner, corner + torch.randint(3, 15, (n, 2), generator=g)), 1)
        masks = torch.randint(0, 2, (n, h, w), generator=g, dtype=torch.uint8)
        samples.append((torch.randint(0, 256, (3, h, w), generator=g, dtype=torch.uint8), boxes,
                        torch.randint(1, 81, (n,), generator=g), masks))
    batch = data.collate_train(samples)
    assert batch.images.shape[-2:] == (64, 64)          # padded: the conversion must crop
    images, targets = throughput.torchvision_inputs(batch)
    assert len(images) == len(targets) == 2
    for image, t, (x, boxes, labels, masks) in zip(images, targets, samples):
        assert torch.equal(image, x.float() / 255)
        assert torch.equal(t["boxes"], boxes + torch.tensor([0.0, 0.0, 1.0, 1.0]))
        assert torch.equal(t["labels"], labels) and t["labels"].dtype == torch.int64
        assert torch.equal(t["masks"], masks) and t["masks"].dtype == torch.uint8
        assert t["boxes"].dtype == torch.float32


def test_plain_steps_flops_are_counted_and_an_image_twice_is_twice_the_work():
    """Proposals and RoIs depend on the data: the (tiny) plain step counts them, per image the
    same with the image once or twice in the batch."""
    one = build(TINY).synthetic_batch(1)
    two = data.TrainBatch(*(torch.cat([t, t]) for t in one))
    once, twice = (MFU.measure(lambda b=b: (build(TINY), b), torch.device("cpu"))
                   for b in (one, two))
    assert once.flops_from == COUNTED and once.flops_per_sample > 0
    assert twice.flops_per_sample == once.flops_per_sample
