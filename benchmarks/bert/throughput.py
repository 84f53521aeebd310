"""BERT-large training throughput (sequences/s) on device-resident batches: the registry's
variants against HuggingFace.

    python -m benchmarks.bert.throughput --batch-size 32 --seq-len 512 --fill 0.6 \
        --precision amp-bf16 --variants config,config-minus-unpad,hf-sdpa

Every synthetic sequence has ``fill`` of its positions real (0.6: about the reference data's
mean), the rest padding. ``plain``, ``config`` (the 1xH100 config's) and ``config-minus-<name>``:
the workload's real step with those optimisations; ``config-plus-<name>``: with one more.
``hf-sdpa``: ``transformers.BertForPreTraining`` (SDPA attention) on the same padded batch
with the config's LAMB (its parameters on one fp32 flat buffer, ``fused-lamb``'s kernels on
CUDA; no weight decay for LayerNorm and bias tensors, as ours); ``hf-sdpa-compiled``: that
model under ``torch.compile``. ``--profile``
adds the GPU kernel time by kernel family. MFU counts the FLOPs of the real tokens only
(``common.mfu``).
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F

from benchmarks.bert import data
from benchmarks.bert.model import BertConfig
from benchmarks.bert.workload import BertWorkload, HParams, no_weight_decay
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.flat_params import FlatParameters
from common.fused_lamb import FusedLamb
from common.lamb import LambHyper, ShardedLamb
from common.mfu import MFU
from common.optimisations import ablation_variants, config_optimisations, plus_variants
from common.precision import Precision
from common.throughput import gpu_variants, measure_variant, report_variants, tool_parser
from common.training import build_parser

# variant -> --optimisations items of the workload's step
CONFIG = config_optimisations("bert", "1xH100")
OURS = {**ablation_variants(BertWorkload.optimisations, CONFIG),
        **plus_variants(BertWorkload.optimisations, CONFIG)}
HF_VARIANTS = ("hf-sdpa", "hf-sdpa-compiled")
VARIANTS = (*OURS, *HF_VARIANTS)


def ours(variant: str, a, precision: Precision, device):
    """The workload built for ``variant``, and its synthetic batch."""
    items = OURS[variant]
    args = build_parser(BertWorkload).parse_args(
        ["--synthetic-data", "--precision", precision.name, "--seed", "0",
         "--max-seq-length", str(a.seq_len), "--batch-size", str(a.batch_size),
         "--synthetic-fill", str(a.fill)] + (["--opt", ",".join(items)] if items else []))
    wl = BertWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl, wl.synthetic_batch(a.batch_size)


def hf(a, precision: Precision, device, compiled: bool):
    import transformers
    net = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=30528, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, attn_implementation="sdpa")).to(device)
    decay = [not no_weight_decay(n) for n, _ in net.named_parameters()]
    lamb = FusedLamb if device.type == "cuda" else ShardedLamb
    opt = lamb(FlatParameters(net), decay, LambHyper())
    lr = torch.tensor(1e-4, device=device)
    model = torch.compile(net) if compiled else net
    batch = data.synthetic_batch(a.batch_size, a.seq_len, HParams.max_predictions,
                                 BertConfig().vocab_size, a.fill, device)   # ours, padded
    ids, seg, mask, pos, labels, nsp = batch
    mlm_labels = torch.full_like(ids, -100).scatter_(1, pos, labels)

    def step(*_):
        opt.zero_grad()
        with precision.autocast():
            out = model(input_ids=ids, token_type_ids=seg, attention_mask=mask)
        loss = (F.cross_entropy(out.prediction_logits.float().flatten(0, 1),
                                mlm_labels.flatten(), ignore_index=-100)
                + F.cross_entropy(out.seq_relationship_logits.float(), nsp))
        loss.backward()
        opt.step(lr)
        return loss
    return step, batch


def setup(variant: str, a, precision: Precision, device):
    """``variant``'s step and batch, built from nothing another variant left behind."""
    if variant in HF_VARIANTS:
        return hf(a, precision, device, compiled=variant == "hf-sdpa-compiled")
    wl, batch = ours(variant, a, precision, device)
    return GraphedStep(wl.train_step, enabled=wl.args.cuda_graph), batch


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.bert.throughput", __doc__,
                    f"plain,config,{HF_VARIANTS[0]}", warmup=15, iters=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--fill", type=float, default=0.6)
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants, VARIANTS)
    device = torch.device("cuda")
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    mfu = MFU.measure(lambda: ours("plain", a, precision, device), device)
    print(mfu, flush=True)
    rows = []
    for variant in variants:
        try:
            step, batch = setup(variant, a, precision, device)
        except ModuleNotFoundError as exc:
            if exc.name != "transformers":
                raise
            print(f"{variant}: skipped ({exc})", flush=True)
            continue
        rows.append(measure_variant(variant, step, batch, device, a.warmup, a.iters,
                                    "seq/s", mfu, a.profile, batch_size=a.batch_size,
                                    fill=a.fill))
        del step, batch
        torch.cuda.empty_cache()
    return report_variants(rows, HF_VARIANTS, a.json)


if __name__ == "__main__":
    sys.exit(main())
