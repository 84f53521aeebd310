"""MLPerf Training ``bert``: BERT-large phase-2 pre-training to 72.0% masked-LM accuracy.

Training reads one endless stream (no epochs); an evaluation's ``epoch_num`` is the number of
samples trained, as the reference logs it. With no optimisation named: HuggingFace's eager BERT
on the padded batch, DDP and LAMB one tensor at a time, as the reference.
"""

from __future__ import annotations

import argparse
import contextlib
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.bert import (
    attention,
    attention_triton,
    data,
    flat_lamb,
    fp8,
    fusions,
    gelu_triton,
    layernorm_triton,
    qkv,
    qkv_triton,
)
from benchmarks.bert.checkpoint import load_checkpoint
from benchmarks.bert.model import BertConfig, BertForPreTraining
from benchmarks.bert.schedule import bert_lr, eval_interval_samples, eval_steps
from common import dist, fixture_cache
from common.errors import UserError
from common.hparams import checked, hparam, non_negative, open_fraction, positive
from common.lamb import Lamb, LambHyper
from common.mllog import constants
from common.optimisations import COMPILE, CUDA_GRAPH, Registry, shared
from common.workload import (
    CapturePolicy,
    EvalPoint,
    Target,
    Workload,
    interval_points,
    maybe_compile,
)

EVAL_SAMPLES = 10_000
# the reference data's mean fill (real tokens over positions) and a lower one
WARM_UP_FILLS = (0.6, 0.5)


@dataclass
class HParams:
    """NVIDIA's v1.1 8-GPU settings (``config_DGXA100_1x8x56x1``), the reference's LAMB."""

    max_seq_length: int = hparam(512, "tokens per sequence", positive)
    max_predictions: int = hparam(76, "masked positions per sequence", positive)
    batch_size: int = hparam(56, "per-rank batch per step", positive)
    grad_accum: int = hparam(1, "micro-batches per step", positive)
    eval_batch_size: int = hparam(128, "sequences per evaluation forward", positive)
    lr: float = hparam(3.5e-4, "opt_base_learning_rate", positive)
    epsilon: float = hparam(1e-6, "LAMB epsilon", positive)
    beta1: float = hparam(0.9, "LAMB beta1", open_fraction)
    beta2: float = hparam(0.999, "LAMB beta2", open_fraction)
    weight_decay: float = hparam(0.01, "LAMB weight decay", non_negative)
    max_grad_norm: float = hparam(1.0, "clip the gradients' global norm to this", positive)
    warmup_steps: int = hparam(0, "steps of linear warm-up", non_negative)
    start_warmup_step: int = hparam(0, "step the warm-up starts from (may be negative)")
    max_steps: int = hparam(7100, "LR decay steps and the step cap", positive)
    max_samples_termination: int = hparam(4_500_000, "sample cap", positive)
    eval_start_samples: int | None = hparam(None, "first evaluation (default: the interval)",
                                            non_negative)
    eval_every_samples: int | None = hparam(None, "evaluation interval (default: MLPerf's "
                                            "floor(0.05*(230.23*B+3e6), 25000))", positive)
    eval_samples: int = hparam(EVAL_SAMPLES, "held-out sequences evaluated", positive)


def _fill(v: float) -> None:
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"must be more than 0 and at most 1, not {v}")


def no_weight_decay(name: str) -> bool:
    """The reference excludes LayerNorm and bias parameters from weight decay (and LAMB's ratio)."""
    return "LayerNorm" in name or name.endswith("bias")


def mllog_tensor_name(name: str) -> str:
    """``bert.encoder.layer.3.attention.self.query.weight`` -> the TF name closed_bert.yaml uses."""
    parts = name.split(".")
    leaf = parts.pop()
    path = "/".join(parts).replace("layer/", "layer_")
    if name == "cls.predictions.bias":
        return "cls/predictions/output_bias"
    if parts[:2] == ["cls", "seq_relationship"]:
        return f"{path}/output_{'weights' if leaf == 'weight' else 'bias'}"
    if parts[-1].endswith("embeddings"):
        return path
    if parts[-1] == "LayerNorm":
        return f"{path}/{'gamma' if leaf == 'weight' else 'beta'}"
    return f"{path}/{'kernel' if leaf == 'weight' else 'bias'}"


def mllog_tensor_names(model: torch.nn.Module) -> list[str]:
    return [mllog_tensor_name(n) for n, _ in model.named_parameters()]


def per_tensor_lamb(wl: BertWorkload, hyper: LambHyper, decay: list[bool]):
    """The reference's ``(model, optimizer)``: DDP, LAMB one tensor at a time."""
    return dist.data_parallel(wl.net, wl.env), Lamb(list(wl.net.parameters()), decay, hyper)


class BertWorkload(Workload):
    name = constants.BERT
    targets = (Target("mlm_accuracy", 0.720),)
    hparams = HParams
    # fp32, the tiny config's three steps with dropout, on the CPU: sdpa, fused-gelu,
    # flat-params 2.2e-7 off; unpad 9.4e-4 and fused-layernorm 1.1e-3 (other dropout masks);
    # compile (GPU, every dropout Inductor's) not measured yet
    optimisations = Registry(
        attention.SDPA, attention.UNPAD, attention_triton.TRITON_ATTENTION, qkv.FUSED_QKV,
        qkv_triton.TRITON_QKV, fusions.FUSED_GELU, gelu_triton.TRITON_GELU,
        fusions.FUSED_LAYERNORM,
        layernorm_triton.TRITON_LAYERNORM, fp8.FP8_FFN, fp8.FP8_WGRAD,
        flat_lamb.FLAT_PARAMS, flat_lamb.SHARDED_OPTIMIZER, flat_lamb.FUSED_LAMB,
        flat_lamb.BF16_WEIGHTS,
        shared(COMPILE, description="torch.compile the whole model (=MODE: default, tuned, "
               "max-autotune-no-cudagraphs)",
               apply=lambda wl, mode: setattr(wl, "model", maybe_compile(wl.model, mode)),
               rtol=3e-3),
        shared(CUDA_GRAPH))

    def __init__(self, args: argparse.Namespace, env, precision):
        super().__init__(args, env, precision)
        # the reference's until an optimisation's select() changes them
        self.impl.data_parallel, self.impl.sharded = per_tensor_lamb, False
        self.impl.fused_lamb = False
        self.impl.weight_dtype, self.impl.bucket = torch.float32, None
        self.impl.packing = lambda mask: ()   # unpad: the bucketed packing of a training batch

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="folder with training/*.hdf5, eval/*.hdf5 and bert_config.json")
        p.add_argument("--train-dir", type=Path, help="training shards (default DATA/training)")
        p.add_argument("--eval-dir", type=Path, help="held-out eval shards (default DATA/eval)")
        p.add_argument("--bert-config", type=Path,
                       help="bert_config.json (default DATA/bert_config.json, else BERT-large)")
        p.add_argument("--init-checkpoint", type=Path,
                       help="phase-1 checkpoint in the reference's PyTorch format (default: "
                            "random init)")
        p.add_argument("--synthetic-fill", type=checked(float, _fill), default=1.0,
                       help="throughput runs on synthetic data: the fraction of each sequence "
                            "that is real tokens (the rest padding; the reference data: ~0.6)")

    # -- set-up ---------------------------------------------------------------------------
    def _config(self) -> BertConfig:
        a = self.args
        # synthetic data: no folder to read; BERT-large unless --bert-config says otherwise
        path = a.bert_config or (None if self.synthetic else a.data_dir / "bert_config.json")
        config = BertConfig.from_json(path) if path and (a.bert_config or path.is_file()) \
            else BertConfig()
        vocab = None if self.synthetic else a.data_dir / "vocab.txt"
        if vocab and vocab.is_file():
            n = len([t for t in vocab.read_text().split("\n") if t])
            if n != config.vocab_size and not a.bert_config and not path.is_file():
                raise UserError(f"{path}: missing, so the model is BERT-large (vocab_size "
                                f"{config.vocab_size}), but {vocab} has {n} tokens: put the "
                                "bert_config.json that goes with this vocab.txt there, or pass "
                                "--bert-config FILE")
            if n != config.vocab_size:
                raise UserError(f"{vocab} has {n} tokens but the bert config says vocab_size "
                                f"{config.vocab_size}: vocab and config/checkpoint do not match")
        if self.hp.max_seq_length > config.max_position_embeddings:
            raise UserError(f"--max-seq-length {self.hp.max_seq_length} exceeds the config's "
                            f"max_position_embeddings {config.max_position_embeddings}")
        return config

    def build(self) -> None:
        a, hp, env = self.args, self.hp, self.env
        if hp.batch_size % hp.grad_accum:
            raise UserError(f"--batch-size {hp.batch_size} is not divisible by "
                            f"--grad-accum {hp.grad_accum}")
        if a.precision == "amp-fp16":
            raise UserError("amp-fp16 is not supported for bert (LAMB runs without a loss "
                            "scaler): use --precision amp-bf16")
        self.config = self._config()
        # what the folder's fixture marker records (a fixture or stand-in this suite wrote)
        self.fixture = None if self.synthetic else fixture_cache.recorded(a.data_dir)
        if not self.synthetic:
            self.train_shards = data.Shards.scan(a.train_dir or a.data_dir / "training",
                                                 hp.max_seq_length, hp.max_predictions)
            self.eval_shards = data.Shards.scan(a.eval_dir or a.data_dir / "eval",
                                                hp.max_seq_length, hp.max_predictions)
        model = BertForPreTraining(self.config)
        if a.init_checkpoint:
            load_checkpoint(model, a.init_checkpoint)
        self.tensor_names = mllog_tensor_names(model)
        self.net = model.to(env.device)
        hyper = LambHyper(hp.beta1, hp.beta2, hp.epsilon, hp.weight_decay, hp.max_grad_norm)
        decay = [not no_weight_decay(n) for n, _ in model.named_parameters()]
        self.model, self.optimizer = self.impl.data_parallel(self, hyper, decay)
        self.step_count = torch.zeros((), device=env.device)
        self.lr = torch.zeros((), device=env.device)
        gbs = self.global_batch_size
        every = hp.eval_every_samples or eval_interval_samples(gbs)
        first = hp.eval_start_samples if hp.eval_start_samples is not None else every
        cap = min(hp.max_steps, hp.max_samples_termination // gbs)
        if cap < 1:
            raise UserError(f"--max-samples-termination {hp.max_samples_termination} is less "
                            f"than one global batch ({gbs})")
        self.eval_at = eval_steps(gbs, first, every, cap)
        if self.synthetic:
            return
        self.stream = data.train_stream(self.train_shards, self.config.vocab_size, gbs,
                                        env.rank, env.world_size, a.seed, env.device,
                                        self.impl.packing)

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        n = self.train_shards.samples
        if fixture_cache.kind(self.args.data_dir) == "bert-standin":
            return (f"stand-in: BERT's shard shapes, random tokens from benchmarks.bert.standin, "
                    f"not Wikipedia ({n} train sequences)")
        if self.fixture is not None:
            return (f"fixture: synthetic corpus in the MLPerf BERT HDF5 format from "
                    f"benchmarks.bert.fixture, not Wikipedia ({n} train sequences)")
        return (f"MLPerf BERT HDF5 shards ({len(self.train_shards.files)} files, {n} train "
                f"sequences; wikipedia 2020-01-01 when prepared by the reference)")

    @property
    def train_samples(self) -> int:
        return self.train_shards.samples

    @property
    def eval_samples(self) -> int:
        return min(self.hp.eval_samples, self.eval_shards.samples)

    def hyperparameters(self) -> dict:
        a, c = self.hp, constants
        return {
            c.OPT_NAME: c.LAMB, c.GRADIENT_ACCUMULATION_STEPS: a.grad_accum,
            c.OPT_BASE_LR: a.lr, c.OPT_LAMB_EPSILON: a.epsilon, "opt_epsilon": a.epsilon,
            c.OPT_LR_TRAINING_STEPS: a.max_steps, c.OPT_LR_WARMUP_STEPS: a.warmup_steps,
            c.NUM_WARMUP_STEPS: a.warmup_steps, c.START_WARMUP_STEP: a.start_warmup_step,
            c.OPT_LAMB_BETA_1: a.beta1, c.OPT_LAMB_BETA_2: a.beta2,
            c.OPT_LAMB_WEIGHT_DECAY: a.weight_decay, c.MAX_SEQUENCE_LENGTH: a.max_seq_length,
        }

    # -- the evaluation schedule ----------------------------------------------------------
    steps_per_epoch = None   # one endless stream

    def eval_points(self) -> list[EvalPoint]:
        return interval_points(self.eval_at, lambda step: step * self.global_batch_size)

    def epoch_batches(self, epoch: int):
        return self.stream

    def capture_policy(self) -> CapturePolicy:
        hp = self.hp
        if isinstance(self.optimizer, Lamb) and self.env.distributed:
            return CapturePolicy("never", reason="without flat-params DDP averages the "
                                                 "gradients, which is not captured here")
        if self.impl.bucket is None:
            return CapturePolicy("static")
        # one graph per bucket of the unpadded token count of a micro-batch
        tokens = hp.batch_size // hp.grad_accum * hp.max_seq_length
        return CapturePolicy("bucketed", max_graphs=-(-tokens // self.impl.bucket))

    def training_state(self) -> list[torch.Tensor]:
        opt = self.optimizer
        state = [*self.net.state_dict(keep_vars=True).values(), self.step_count, self.lr, opt.t]
        state += [*opt.m, *opt.v] if isinstance(opt, Lamb) else [opt.m, opt.v]
        flat = getattr(opt, "flat", None)
        if flat is not None and flat.master is not flat.data:   # bf16 weights: fp32 masters
            state.append(flat.master)
        return state

    # -- steps ----------------------------------------------------------------------------
    def train_step(self, ids, segments, mask, positions, mlm_ids, nsp_labels,
                   pack_index=None, pack_offsets=None) -> torch.Tensor:
        """One optimizer step; ``pack_*``: the batch's ``bucketed_packing`` (unpad)."""
        hp = self.hp
        self.lr.copy_(bert_lr(self.step_count, hp.lr, hp.max_steps, hp.warmup_steps,
                              hp.start_warmup_step))
        flat = getattr(self.optimizer, "flat", None)
        if flat is None:
            self.optimizer.zero_grad()
        total = torch.zeros((), device=ids.device)
        micro = [t.chunk(hp.grad_accum) for t in (ids, segments, mask, positions, mlm_ids,
                                                   nsp_labels)]
        packs = (zip(pack_index, pack_offsets) if pack_index is not None
                 else [()] * hp.grad_accum)
        for i, ((x, s, m, p, y, n), pack) in enumerate(zip(zip(*micro), packs)):
            last = i == hp.grad_accum - 1   # DDP: average the gradients once, after the last
            with (self.model.no_sync() if not last and hasattr(self.model, "no_sync")
                  else contextlib.nullcontext()):
                with self.precision.autocast():
                    mlm, nsp = self.model(x, s, m, p, *pack)
                labels = torch.where(p != 0, y, -100).flatten()
                loss = (F.cross_entropy(mlm.float().flatten(0, 1), labels, ignore_index=-100)
                        + F.cross_entropy(nsp.float(), n)) / hp.grad_accum
                if flat is None:
                    loss.backward()
                else:
                    flat.backward(loss, accumulate=i > 0)
            total += loss.detach()
        self.optimizer.step(self.lr)
        self.step_count += 1
        return total

    def evaluate(self) -> dict[str, float]:
        a, env = self.hp, self.env
        self.model.eval()
        counts = torch.zeros(2, dtype=torch.float64, device=env.device)
        for ids, segments, mask, positions, mlm_ids, _ in data.eval_batches(
                self.eval_shards, self.config.vocab_size, a.eval_batch_size, env.rank,
                env.world_size, env.device, limit=self.eval_samples):
            with self.precision.autocast():
                mlm, _ = self.model(ids, segments, mask, positions)
            valid = positions != 0
            counts[0] += ((mlm.argmax(-1) == mlm_ids) & valid).sum()
            counts[1] += valid.sum()
        self.model.train()
        dist.all_reduce_sum(counts)
        correct, total = counts.tolist()
        return {"mlm_accuracy": correct / max(total, 1.0)}

    # -- throughput harness ---------------------------------------------------------------
    @property
    def flops_per_sample(self) -> float:
        """Training FLOPs of a synthetic sequence's real tokens (``--synthetic-fill``): the
        useful work, so FLOPs spent on padding do not count towards utilisation."""
        hp, c = self.hp, self.config
        s = data.synthetic_length(hp.max_seq_length, hp.max_predictions, self.args.synthetic_fill)
        h, f, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
        dense = layers * (4 * h * h + 2 * h * f)
        return 6.0 * dense * s + 12.0 * layers * s * s * h

    def synthetic_batch(self, batch_size: int, fill: float | None = None
                        ) -> tuple[torch.Tensor, ...]:
        """Random tokens; each sequence has ``fill`` (default ``--synthetic-fill``) of its
        positions real, the rest padding (plus unpad's bucketed packing)."""
        fill = self.args.synthetic_fill if fill is None else fill
        batch = data.synthetic_batch(batch_size, self.hp.max_seq_length,
                                     self.hp.max_predictions, self.config.vocab_size, fill,
                                     self.env.device)
        packing = self.impl.packing(batch[2].cpu().numpy())
        return batch + tuple(torch.from_numpy(t).to(self.env.device) for t in packing)

    def warm_up_batches(self, batch_size: int) -> list[tuple]:
        """With ``unpad``, batches at ``WARM_UP_FILLS`` (two token counts, near the reference
        data's): the graphs of buckets a run meets, rather than the full one, are built
        before the clock, and ``compile`` meets its second shape there (where it recompiles
        with the token count dynamic)."""
        if self.impl.bucket is None:
            return super().warm_up_batches(batch_size)
        return [self.synthetic_batch(batch_size, fill) for fill in WARM_UP_FILLS]

    def infer_step(self, ids, segments, mask, positions, mlm_ids, nsp_labels,
                   pack_index=None, pack_offsets=None) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad(), self.precision.autocast():
            mlm, _ = self.model(ids, segments, mask, positions)
        self.model.train()
        return mlm
