"""BERT-large training throughput (sequences/s) on device-resident batches, ours vs HuggingFace.

    python -m benchmarks.bert.throughput --batch-size 32 --seq-len 512 --fill 0.6 \\
        --precision amp-bf16 --variants ours-unpad,ours-sdpa-graph,hf-sdpa

Every sequence of the synthetic batch has ``fill`` of its 512 positions real
and the rest padding (0.6: about the reference Wikipedia data's mean fill).
``ours-unpad``: the suite's real step (flat parameters, LAMB, masked-LM head
on the masked positions only) with padding removed (flash attention on the
packed sequences, token count rounded to a 512 bucket) as one CUDA graph;
``ours-unpad-eager``: the same without the graph; ``ours-unpad-fused-ln``: with
bias+dropout+residual+LayerNorm also compiled into fused kernels;
``ours-unpad-bf16w``: with bf16 model weights, gradients and residual stream (fp32
master in LAMB); ``ours-unpad-bf16w-fused-ln``: both;
``ours-sdpa-graph``: the same step on padded SDPA as one CUDA graph;
``ours-plain``: the plain model (explicit softmax attention, per-tensor LAMB).
``hf-sdpa``: ``transformers.BertForPreTraining`` with SDPA attention and
``torch.optim.AdamW``, the step a user would otherwise run, on the same padded batch.
Each variant builds its own step and batch, so ``--variants`` may come in any order.
``--profile`` adds each variant's GPU kernel time by kernel family. MFU (``common.mfu``) takes
the workload's FLOPs of a sequence's real tokens for every variant, ``hf-sdpa`` included (the
same network on the same tokens).
"""

from __future__ import annotations

import json
import sys

import torch
import torch.nn.functional as F

from benchmarks.bert import data
from benchmarks.bert.model import BertConfig
from benchmarks.bert.workload import BertWorkload
from common.cuda_graph import GraphedStep
from common.dist import DistEnv
from common.kernel_profile import kernel_breakdown
from common.mfu import MFU
from common.precision import Precision
from common.throughput import gpu_variants, time_steps, tool_parser
from common.training import build_parser

OURS = {"ours-unpad": ("unpad", True, ["--fused-gelu"]),
        "ours-unpad-fused-ln": ("unpad", True, ["--fused-gelu", "--fused-layernorm"]),
        "ours-unpad-bf16w": ("unpad", True, ["--fused-gelu", "--bf16-weights"]),
        "ours-unpad-bf16w-fused-ln": ("unpad", True, ["--fused-gelu", "--bf16-weights",
                                                      "--fused-layernorm"]),
        "ours-unpad-eager": ("unpad", False, ["--fused-gelu"]),
        "ours-sdpa-graph": ("sdpa", True, ["--fused-gelu"]),
        "ours-plain": ("plain", False, ["--no-flat-params"])}
VARIANTS = (*OURS, "hf-sdpa")


def ours(variant: str, a, precision: Precision, device):
    """The workload built for ``variant``, and its synthetic batch."""
    attention, graph, extra = OURS[variant]
    args = build_parser(BertWorkload).parse_args(
        ["--synthetic-data", "--precision", precision.name, "--seed", "0",
         "--attention", attention, "--max-seq-length", str(a.seq_len),
         "--batch-size", str(a.batch_size), "--synthetic-fill", str(a.fill),
         "--cuda-graph" if graph else "--no-cuda-graph", *extra])
    wl = BertWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl, wl.synthetic_batch(a.batch_size)


def padded_batch(a, device) -> tuple[torch.Tensor, ...]:
    """The padded batch that every ``ours`` variant's batch starts with (without unpad's
    packing): the workload's default masked positions and BERT-large's vocabulary."""
    max_predictions = build_parser(BertWorkload).get_default("max_predictions")
    return data.synthetic_batch(a.batch_size, a.seq_len, max_predictions,
                                BertConfig().vocab_size, a.fill, device)


def hf(a, precision: Precision, device):
    import transformers
    model = transformers.BertForPreTraining(transformers.BertConfig(
        vocab_size=30528, hidden_size=1024, num_hidden_layers=24, num_attention_heads=16,
        intermediate_size=4096, attn_implementation="sdpa")).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = padded_batch(a, device)
    ids, seg, mask, pos, labels, nsp = batch
    mlm_labels = torch.full_like(ids, -100).scatter_(1, pos, labels)

    def step(*_):
        opt.zero_grad(set_to_none=True)
        with precision.autocast():
            out = model(input_ids=ids, token_type_ids=seg, attention_mask=mask)
        loss = (F.cross_entropy(out.prediction_logits.float().flatten(0, 1),
                                mlm_labels.flatten(), ignore_index=-100)
                + F.cross_entropy(out.seq_relationship_logits.float(), nsp))
        loss.backward()
        opt.step()
        return loss
    return step, batch


def setup(variant: str, a, precision: Precision, device):
    """``variant``'s step and the batch it runs on, built from nothing another variant
    left behind."""
    if variant == "hf-sdpa":
        return hf(a, precision, device)
    wl, batch = ours(variant, a, precision, device)
    return GraphedStep(wl.train_step, enabled=OURS[variant][1]), batch


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.bert.throughput", __doc__, ",".join(VARIANTS),
                    warmup=15, iters=20)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--fill", type=float, default=0.6)
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants, VARIANTS)
    device = torch.device("cuda")
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    mfu = MFU.measure(lambda: ours("ours-plain", a, precision, device), device)
    print(mfu, flush=True)
    results = {}
    for variant in variants:
        try:
            step, batch = setup(variant, a, precision, device)
        except ModuleNotFoundError as exc:
            if exc.name != "transformers":
                raise
            print(f"{variant}: skipped ({exc})", flush=True)
            continue
        m = time_steps(variant, step, batch, device, a.warmup, a.iters)
        results[variant] = dict(seq_per_s=round(m.samples_per_second, 1),
                                peak_gib=round(m.peak_memory_bytes / 2**30, 2),
                                **mfu.row(m.samples_per_second))
        print(f"{variant}: {results[variant]['seq_per_s']} seq/s, "
              f"{mfu.text(m.samples_per_second)}, peak {results[variant]['peak_gib']} GiB",
              flush=True)
        if a.profile:
            print(kernel_breakdown(step, batch, top=25), flush=True)
        del step, batch
        torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(vars(a), results=results), f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
