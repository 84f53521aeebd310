"""MLPerf Training ``bert``: BERT-large phase-2 pre-training to 72.0% masked-LM accuracy.

Defaults are NVIDIA's v1.1 DGX A100 8-GPU settings (global batch 448 = 8 x 56,
LAMB with base LR 3.5e-4, betas 0.9/0.999, weight decay 0.01, no warm-up,
7100 steps, linear decay; evaluation on the 10000 held-out samples every
150000 samples, at most 4.5M samples). Training reads one endless stream (no
epochs); an evaluation's ``epoch_num`` is the number of samples trained, as the
reference logs it.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from benchmarks.bert import data
from benchmarks.bert.checkpoint import load_checkpoint
from benchmarks.bert.model import (
    ATTENTION_IMPLS,
    BertConfig,
    BertForPreTraining,
    Fusions,
    bucketed_packing,
    mllog_tensor_names,
    no_weight_decay,
)
from benchmarks.bert.schedule import bert_lr, eval_interval_samples, eval_steps
from common import dist
from common.errors import UserError
from common.flat_params import FlatParameters
from common.hparams import checked, positive
from common.lamb import Lamb, LambHyper, ShardedLamb
from common.mllog import constants
from common.workload import (
    CapturePolicy,
    EvalPoint,
    Target,
    Workload,
    interval_points,
    maybe_compile,
)

FIXTURE_MARKER = "FIXTURE_COMPLETE"
EVAL_SAMPLES = 10_000


class BertWorkload(Workload):
    name = constants.BERT
    targets = (Target("mlm_accuracy", 0.720),)

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
        p.add_argument("--max-seq-length", type=checked(int, positive), default=512)
        p.add_argument("--max-predictions", type=checked(int, positive), default=76)
        p.add_argument("--batch-size", type=checked(int, positive),
                       default=56, help="per-rank batch per step")
        p.add_argument("--grad-accum", type=checked(int, positive), default=1,
                       help="micro-batches per step (each of --batch-size / --grad-accum)")
        p.add_argument("--eval-batch-size", type=checked(int, positive), default=128)
        p.add_argument("--lr", type=checked(float, positive),
                       default=3.5e-4, help="opt_base_learning_rate")
        p.add_argument("--epsilon", type=float, default=1e-6)
        p.add_argument("--beta1", type=float, default=0.9)
        p.add_argument("--beta2", type=float, default=0.999)
        p.add_argument("--weight-decay", type=float, default=0.01)
        p.add_argument("--max-grad-norm", type=float, default=1.0)
        p.add_argument("--warmup-steps", type=int, default=0)
        p.add_argument("--start-warmup-step", type=int, default=0)
        p.add_argument("--max-steps", type=int, default=7100,
                       help="opt_learning_rate_training_steps (and the step cap)")
        p.add_argument("--max-samples-termination", type=int, default=4_500_000)
        p.add_argument("--eval-start-samples", type=int, default=None,
                       help="first evaluation (default: the MLPerf interval for the batch)")
        p.add_argument("--eval-every-samples", type=int, default=None,
                       help="evaluation interval (default floor(0.05*(230.23*B+3e6), 25000))")
        p.add_argument("--eval-samples", type=int, default=EVAL_SAMPLES)
        p.add_argument("--attention", default="sdpa", choices=ATTENTION_IMPLS,
                       help="plain softmax, padded SDPA, or unpadded (packed) SDPA")
        p.add_argument("--unpad-bucket", type=int, default=512,
                       help="unpad: round each batch's token count up to a multiple of this, "
                            "so a few CUDA graphs (one per bucket) serve all batches")
        p.add_argument("--synthetic-fill", type=float, default=1.0,
                       help="throughput runs on synthetic data: the fraction of each sequence "
                            "that is real tokens (the rest padding; the reference data: ~0.6)")
        p.add_argument("--fused-gelu", action=argparse.BooleanOptionalAction, default=False,
                       help="bias+GELU as one compiled kernel")
        p.add_argument("--fused-layernorm", action=argparse.BooleanOptionalAction,
                       default=False, help="bias+dropout+residual+LayerNorm as compiled kernels")
        p.add_argument("--flat-params", action=argparse.BooleanOptionalAction, default=True,
                       help="parameters and gradients in one buffer, LAMB on the flat buffer")
        p.add_argument("--bf16-weights", action=argparse.BooleanOptionalAction, default=False,
                       help="amp-bf16 with --flat-params: bf16 model weights and gradients, "
                            "fp32 master weights inside LAMB (no per-step weight casts)")
        p.add_argument("--sharded-optimizer", action=argparse.BooleanOptionalAction,
                       default=True, help="each rank updates its shard, then one all-gather")

    # -- set-up ---------------------------------------------------------------------------
    def _check_args(self) -> None:
        a, env = self.args, self.env
        if a.batch_size % a.grad_accum:
            raise UserError(f"--batch-size {a.batch_size} is not divisible by "
                            f"--grad-accum {a.grad_accum}")
        if a.precision == "amp-fp16":
            raise UserError("amp-fp16 is not supported for bert (LAMB runs without a loss "
                            "scaler): use --precision amp-bf16")
        if a.attention == "unpad" and env.device.type == "cuda" and a.precision != "amp-bf16":
            raise UserError(f"--attention unpad runs flash attention, which has no "
                            f"{a.precision} kernel: use --precision amp-bf16")
        if a.bf16_weights and not (a.flat_params and a.precision == "amp-bf16"):
            raise UserError("--bf16-weights needs --flat-params and --precision amp-bf16")
        if not 0 < a.synthetic_fill <= 1:
            raise UserError(f"--synthetic-fill must be in (0, 1], not {a.synthetic_fill}")
        if a.unpad_bucket < 1:
            raise UserError(f"--unpad-bucket must be >= 1 token, not {a.unpad_bucket}")

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
        if a.max_seq_length > config.max_position_embeddings:
            raise UserError(f"--max-seq-length {a.max_seq_length} exceeds the config's "
                            f"max_position_embeddings {config.max_position_embeddings}")
        return config

    def build(self) -> None:
        a, env = self.args, self.env
        self._check_args()
        self.config = self._config()
        self.fixture = not self.synthetic and (a.data_dir / FIXTURE_MARKER).is_file()
        if not self.synthetic:
            self.train_shards = data.Shards.scan(a.train_dir or a.data_dir / "training",
                                                 a.max_seq_length, a.max_predictions)
            self.eval_shards = data.Shards.scan(a.eval_dir or a.data_dir / "eval",
                                                a.max_seq_length, a.max_predictions)
        model = BertForPreTraining(self.config, a.attention,
                                   Fusions(a.fused_gelu, a.fused_layernorm))
        if a.init_checkpoint:
            load_checkpoint(model, a.init_checkpoint)
        self.tensor_names = mllog_tensor_names(model)
        model = model.to(env.device)
        self.net = model
        h = LambHyper(a.beta1, a.beta2, a.epsilon, a.weight_decay, a.max_grad_norm)
        if a.flat_params:
            shards = env.world_size if a.sharded_optimizer else 1
            flat = FlatParameters(model, shards,
                                  torch.bfloat16 if a.bf16_weights else torch.float32)
            if env.distributed:
                flat.broadcast(0)  # the same initial weights everywhere
            decay = [not no_weight_decay(n) for n in flat.names]
            self.optimizer = ShardedLamb(flat, decay, h, env.rank, env.world_size,
                                         a.sharded_optimizer)
            self.model = maybe_compile(model, a.compile)
        else:
            named = list(model.named_parameters())
            self.optimizer = Lamb([p for _, p in named],
                                  [not no_weight_decay(n) for n, _ in named], h)
            self.model = maybe_compile(dist.data_parallel(model, env), a.compile)
        self.step_count = torch.zeros((), device=env.device)
        self.lr = torch.zeros((), device=env.device)
        gbs = self.global_batch_size
        every = a.eval_every_samples or eval_interval_samples(gbs)
        first = a.eval_start_samples if a.eval_start_samples is not None else every
        cap = min(a.max_steps, a.max_samples_termination // gbs)
        if cap < 1:
            raise UserError(f"--max-samples-termination {a.max_samples_termination} is less "
                            f"than one global batch ({gbs})")
        self.eval_at = eval_steps(gbs, first, every, cap)
        if self.synthetic:
            return
        self.stream = data.train_stream(self.train_shards, self.config.vocab_size, gbs,
                                        env.rank, env.world_size, a.seed, env.device,
                                        self._packing)

    def _packing(self, mask: np.ndarray) -> tuple[np.ndarray, ...]:
        """The bucketed packing appended to every training batch of ``--attention unpad``."""
        if self.args.attention != "unpad":
            return ()
        return bucketed_packing(mask, self.args.grad_accum, self.args.unpad_bucket)

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident tensors)"
        n = self.train_shards.samples
        if self.fixture:
            return (f"fixture: synthetic corpus in the MLPerf BERT HDF5 format from "
                    f"benchmarks.bert.fixture, not Wikipedia ({n} train sequences)")
        return (f"MLPerf BERT HDF5 shards ({len(self.train_shards.files)} files, {n} train "
                f"sequences; wikipedia 2020-01-01 when prepared by the reference)")

    @property
    def global_batch_size(self) -> int:
        return self.args.batch_size * self.env.world_size

    @property
    def train_samples(self) -> int:
        return self.train_shards.samples

    @property
    def eval_samples(self) -> int:
        return min(self.args.eval_samples, self.eval_shards.samples)

    def hyperparameters(self) -> dict:
        a, c = self.args, constants
        return {
            c.OPT_NAME: c.LAMB, c.GRADIENT_ACCUMULATION_STEPS: a.grad_accum,
            c.OPT_BASE_LR: a.lr, c.OPT_LAMB_EPSILON: a.epsilon, "opt_epsilon": a.epsilon,
            c.OPT_LR_TRAINING_STEPS: a.max_steps, c.OPT_LR_WARMUP_STEPS: a.warmup_steps,
            c.NUM_WARMUP_STEPS: a.warmup_steps, c.START_WARMUP_STEP: a.start_warmup_step,
            c.OPT_LAMB_BETA_1: a.beta1, c.OPT_LAMB_BETA_2: a.beta2,
            c.OPT_LAMB_WEIGHT_DECAY: a.weight_decay, c.MAX_SEQUENCE_LENGTH: a.max_seq_length,
        }

    def initialized_tensors(self) -> list[str]:
        return self.tensor_names

    # -- the evaluation schedule ----------------------------------------------------------
    steps_per_epoch = None   # one endless stream

    def eval_points(self) -> list[EvalPoint]:
        return interval_points(self.eval_at, lambda step: step * self.global_batch_size)

    def epoch_batches(self, epoch: int):
        return self.stream

    def capture_policy(self) -> CapturePolicy:
        a = self.args
        if not a.flat_params and self.env.distributed:
            return CapturePolicy("never", reason="--no-flat-params uses DDP, which is not "
                                                 "captured here")
        if a.attention != "unpad":
            return CapturePolicy("static")
        # one graph per bucket of the unpadded token count of a micro-batch
        tokens = a.batch_size // a.grad_accum * a.max_seq_length
        return CapturePolicy("bucketed", max_graphs=-(-tokens // a.unpad_bucket))

    def training_state(self) -> list[torch.Tensor]:
        opt = self.optimizer
        state = [*self.net.state_dict(keep_vars=True).values(), self.step_count, self.lr, opt.t]
        state += [*opt.m, *opt.v] if isinstance(opt, Lamb) else [opt.m, opt.v]
        flat = getattr(opt, "flat", None)
        if flat is not None and flat.master is not flat.data:   # bf16 weights: fp32 masters
            state.append(flat.master)
        return state

    # -- steps ----------------------------------------------------------------------------
    def _loss(self, mlm, nsp, positions, mlm_ids, nsp_labels) -> torch.Tensor:
        labels = torch.where(positions != 0, mlm_ids, -100)
        mlm_loss = F.cross_entropy(mlm.float().flatten(0, 1), labels.flatten(), ignore_index=-100)
        return mlm_loss + F.cross_entropy(nsp.float(), nsp_labels)

    def train_step(self, ids, segments, mask, positions, mlm_ids, nsp_labels,
                   pack_index=None, pack_offsets=None) -> torch.Tensor:
        """One optimizer step; ``pack_*``: the batch's ``bucketed_packing`` (unpad)."""
        a = self.args
        self.lr.copy_(bert_lr(self.step_count, a.lr, a.max_steps, a.warmup_steps,
                              a.start_warmup_step))
        self.optimizer.zero_grad()
        total = torch.zeros((), device=ids.device)
        micro = [t.chunk(a.grad_accum) for t in (ids, segments, mask, positions, mlm_ids,
                                                  nsp_labels)]
        packs = (zip(pack_index, pack_offsets) if pack_index is not None
                 else [(None, None)] * a.grad_accum)
        for i, ((x, s, m, p, y, n), pack) in enumerate(zip(zip(*micro), packs)):
            last = i == a.grad_accum - 1
            sync = (self.model.no_sync() if (not last and hasattr(self.model, "no_sync"))
                    else contextlib.nullcontext())
            with sync:
                with self.precision.autocast():
                    mlm, nsp = self.model(x, s, m, p, *pack)
                loss = self._loss(mlm, nsp, p, y, n) / a.grad_accum
                loss.backward()
            total += loss.detach()
        self.optimizer.step(self.lr)
        self.step_count += 1
        return total

    def evaluate(self) -> dict[str, float]:
        a, env = self.args, self.env
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
        a, c = self.args, self.config
        s = data.synthetic_length(a.max_seq_length, a.max_predictions, a.synthetic_fill)
        h, f, layers = c.hidden_size, c.intermediate_size, c.num_hidden_layers
        dense = layers * (4 * h * h + 2 * h * f)
        return 6.0 * dense * s + 12.0 * layers * s * s * h

    def synthetic_batch(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """Random tokens; each sequence has ``--synthetic-fill`` of its positions real, the
        rest padding (plus the bucketed packing for ``--attention unpad``)."""
        batch = data.synthetic_batch(batch_size, self.args.max_seq_length,
                                     self.args.max_predictions, self.config.vocab_size,
                                     self.args.synthetic_fill, self.env.device)
        packing = self._packing(batch[2].cpu().numpy())
        return batch + tuple(torch.from_numpy(t).to(self.env.device) for t in packing)

    def infer_step(self, ids, segments, mask, positions, mlm_ids, nsp_labels,
                   pack_index=None, pack_offsets=None) -> torch.Tensor:
        self.model.eval()
        with torch.no_grad(), self.precision.autocast():
            mlm, _ = self.model(ids, segments, mask, positions)
        self.model.train()
        return mlm
