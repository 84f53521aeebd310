"""MLPerf Training ``dlrm``: DLRM on Criteo Terabyte to an evaluation AUC of 0.8025.

``HParams`` holds the ruleset's reference convergence point for global batch 55296 (NVIDIA's
v1.1 setting): one epoch (75868 steps), evaluation on the whole test set every 0.05 epoch;
``epoch_num`` is 1 plus the epochs trained, as the reference logs it. No optimisation named: the
reference's one ``nn.EmbeddingBag`` a table and ``torch.optim.SGD``, in one process.
"""

from __future__ import annotations

import argparse
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F

from benchmarks.dlrm import (
    aligned,
    bf16_tables,
    data,
    fused_sgd,
    interaction,
    lookups_triton,
    sparse_triton,
    split_linear,
)
from benchmarks.dlrm.auc import roc_auc
from benchmarks.dlrm.hybrid import HybridEmbedding, Plan, frequent_rows
from benchmarks.dlrm.model import DenseArch, PlainEmbeddings, mllog_tensor_names, parse_mlp
from common import dist, fixture_cache
from common.errors import UserError
from common.hparams import checked, hparam, non_negative, positive
from common.mllog import constants
from common.optimisations import COMPILE, CUDA_GRAPH, Optimisation, Registry, shared
from common.progress import say
from common.workload import (
    CapturePolicy,
    EvalPoint,
    Target,
    Workload,
    interval_points,
    maybe_compile,
)

CRITEO_TRAIN_SAMPLES = 4_195_197_692
CRITEO_EVAL_SAMPLES = 89_137_319


@dataclass
class HParams:
    """SGD with the reference's warm-up and polynomial decay (rcps_dlrm.json)."""

    batch_size: int = hparam(55296, "global batch per step", positive)
    eval_batch_size: int = hparam(1769472, "global eval batch", positive)
    epochs: int = hparam(1, "epoch cap", positive)
    eval_every: float = hparam(0.05, "fraction of an epoch between evaluations", positive)
    lr: float = hparam(24.0, "base learning rate", non_negative)
    warmup_steps: int = hparam(2750, "steps of linear warm-up", non_negative)
    decay_start_step: int = hparam(49315, "first step of the polynomial decay", non_negative)
    decay_steps: int = hparam(27772, "steps of the decay to 0", non_negative)
    poly_power: float = hparam(2.0, "decay power (closed_dlrm.yaml: 2)", choices=(2.0,))
    embedding_dim: int = hparam(128, "embedding width", positive)
    arch_mlp_bot: str = hparam("13-512-256-128", "bottom MLP widths")
    arch_mlp_top: str = hparam("1024-1024-512-256-1", "top MLP widths after the interaction")
    max_ind_range: int = hparam(40_000_000, "ids taken modulo this; tables capped to it",
                                positive)
    shuffle: bool = hparam(True, "shuffle whole batches each epoch (--mlperf-bin-shuffle)")


def lr_at(step: torch.Tensor, base: float, warmup: int, decay_start: int, decay_steps: int,
          power: float) -> torch.Tensor:
    """The reference's schedule: linear warm-up, constant, polynomial decay to 0 (device ops)."""
    warm = base * torch.clamp((step + 1) / max(warmup, 1), max=1.0)
    frac = torch.clamp(1 - (step - decay_start) / max(decay_steps, 1), min=0.0, max=1.0)
    return torch.where(step < warmup, warm,
                       torch.where(step >= decay_start, base * frac ** power, base + 0 * step))


# threads reading batches ahead: reading, checking and transforming a global batch of 55,296
# (8.8 MB; numpy releases the GIL) took 25 ms on one core of a 2-core CPU machine, longer than
# the config's step on an H200 (13 ms)
LOADER_THREADS = 4
EXCHANGE_GRAPHS = 4   # on several ranks, CUDA graphs kept: one an exchange capacity


class _Epoch:
    """The batches of one epoch, each read, planned and (on CUDA) copied to the device ahead
    of its step by one of ``LOADER_THREADS`` threads, in order. The copies go on a stream of
    their own; the consumer's stream waits for each batch's copy before using it, and the
    batch's memory is marked as used there, so it is not handed to a later copy while a step
    still reads it."""

    def __init__(self, wl: DLRMWorkload, ranges: list[tuple[int, int]]):
        self.wl, self.ranges = wl, ranges

    def __len__(self) -> int:
        return len(self.ranges)

    def __iter__(self):
        wl, dev = self.wl, self.wl.env.device
        if not wl.prefetch:
            for r in self.ranges:
                yield wl.prepare(*r)
            return
        if dev.type != "cuda":
            def load(*r):
                return wl.prepare(*r), None
            init = None
        else:
            index = torch.cuda.current_device() if dev.index is None else dev.index
            copies = torch.cuda.Stream(index)

            def load(*r):
                host = wl.prepare_host(*r)
                with torch.cuda.stream(copies):
                    batch = wl.to_device(host)
                    ready = torch.cuda.Event()
                    ready.record(copies)
                return batch, ready

            def init():   # the thread's CUDA calls in this rank's device context
                torch.cuda.set_device(index)
        with ThreadPoolExecutor(LOADER_THREADS, initializer=init) as pool:
            ahead = LOADER_THREADS + 1
            pending = [pool.submit(load, *r) for r in self.ranges[:ahead]]
            for i in range(len(self.ranges)):
                batch, ready = pending.pop(0).result()
                if i + ahead < len(self.ranges):
                    pending.append(pool.submit(load, *self.ranges[i + ahead]))
                if ready is not None:
                    stream = torch.cuda.current_stream(index)
                    stream.wait_event(ready)
                    for t in _tensors(batch):
                        t.record_stream(stream)
                yield batch


def _tensors(batch) -> list[torch.Tensor]:
    return [t for x in batch
            for t in (x.tensors() if isinstance(x, Plan) else
                      x.values() if isinstance(x, dict) else [x])]


def _hybrid_update(wl: DLRMWorkload, sparse):
    return partial(fused_sgd.hybrid_update, list(wl.dense_arch.parameters()), wl.emb, wl.lr,
                   wl.env.distributed, sparse=sparse,
                   frequent_dtype=getattr(wl.impl, "frequent_dtype", torch.float32),
                   table=getattr(wl.impl, "table_sgd", fused_sgd.table_sgd_))


def _fused_sgd(wl: DLRMWorkload, _) -> None:
    params, lp = list(wl.dense_arch.parameters()), wl.precision.autocast_dtype
    sparse = getattr(wl.impl, "sparse_sgd", fused_sgd.sparse_sgd_)   # triton-sparse-sgd's
    if isinstance(wl.emb, HybridEmbedding):
        if lp is not None and wl.env.device.type == "cuda":
            wl.emb.keep_low_precision(lp)
        wl.update = _hybrid_update(wl, sparse)
    else:
        bags = [bag.weight for bag in wl.emb.tables]
        wl.update = partial(fused_sgd.bags_update, params, bags, wl.lr, sparse=sparse)
    wl.optimizer = None


def _triton_sparse_sgd(wl: DLRMWorkload, _) -> None:
    wl.impl.sparse_sgd, wl.impl.table_sgd = sparse_triton.sparse_sgd_, sparse_triton.table_sgd_


def _bf16_tables(wl: DLRMWorkload, _) -> None:
    """The rare table in bf16 (built so: no fp32 master), updated by ``bf16_tables``: over the
    plan's runs in Triton with ``fused-lookups``, else the reference."""
    emb, seed = wl.emb, wl.args.seed + (wl.env.rank << 40)
    if emb.freq_lp is None:   # lookups read bf16 from both tables
        emb.keep_low_precision(torch.bfloat16)
    emb.rare_lp = None   # the rare table, built in bf16 (rare_dtype), is what lookups read
    if hasattr(emb, "plan_runs"):   # fused-lookups'
        emb.plan_runs = True
        seed = torch.tensor(seed, device=wl.env.device)
        sparse = lambda table, _copy, _rows, grads, lr: bf16_tables.run_sgd_(  # noqa: E731
            table, grads, emb._plan, lr, seed)
    else:
        sparse = partial(bf16_tables.sparse_sgd_sr_,
                         generator=torch.Generator(wl.env.device).manual_seed(seed))
    wl.update = _hybrid_update(wl, sparse)


def _compile(wl: DLRMWorkload, mode: str) -> None:
    """The dense part's two regions compiled (after ``aligned-dense``, which it then fuses):
    the embeddings' lookups and their update stay as they are."""
    dense = wl.dense_arch
    dense.bottom_mlp.forward = maybe_compile(dense.bottom_mlp.forward, mode)
    dense.forward = maybe_compile(dense.forward, mode)


def _split_linear(wl: DLRMWorkload, _) -> None:
    split_linear.split(wl.dense_arch)
    update = wl.update   # it reads the weight gradients: join the side streams first
    wl.update = lambda: (split_linear.wait_for_weight_grads(), update())


class DLRMWorkload(Workload):
    name = "dlrm"            # the 1.1.0 benchmark name (newer mllog constants say dlrmv4)
    targets = (Target("auc", 0.8025),)
    full_dataset = (CRITEO_TRAIN_SAMPLES, CRITEO_EVAL_SAMPLES)
    batch_size_is_global = True
    steps_per_epoch = 0      # set by build
    hparams = HParams
    prefetch = cache_eval = False   # until the optimisations of these names

    # fp32 on the CPU, the tiny config's three steps: hybrid-embeddings 9e-8 off, the others equal
    optimisations = Registry(
        Optimisation("fused-sgd", "SGD as one multi-tensor MLP update and index_add updates of "
                     "the rows a step touched, LR on the device; under amp on CUDA hybrid "
                     "lookups read a bf16 copy it refreshes (fused_sgd.py)", apply=_fused_sgd,
                     rtol=1e-7),
        Optimisation("triton-sparse-sgd", "fused-sgd's embedding-row update as two Triton "
                     "kernels: atomic adds of -lr * grad into the fp32 rows, then the rows' "
                     "low-precision copy; a hybrid frequent table and its copy in one pass "
                     "(sparse_triton.py)", requires=("fused-sgd",),
                     cuda=True, compare=None,
                     tested_by="tests/benchmarks/dlrm/test_sparse_triton.py",
                     select=_triton_sparse_sgd),
        Optimisation("hybrid-embeddings", "=T: rows seen T times in --stats-batches batches "
                     "replicated, the rest sharded over the ranks and exchanged by all-to-all "
                     "(hybrid.py)", requires=("fused-sgd",), rtol=1e-6, default=20.0,
                     value_type=checked(float, non_negative),
                     select=lambda wl, t: setattr(wl.impl, "frequent_threshold", t)),
        Optimisation("bf16-frequent-grads", "on several ranks the frequent rows' gradient "
                     "summed over them in bf16, half the bytes of the step's largest all-reduce "
                     "(fused_sgd.py; one rank has none)", requires=("hybrid-embeddings",),
                     compare=None, tested_by="tests/benchmarks/dlrm/test_hybrid.py",
                     select=lambda wl, _: setattr(wl.impl, "frequent_dtype", torch.bfloat16)),
        Optimisation("model-parallel-embeddings", "every row sharded over the ranks, exchanged "
                     "by all-to-all (hybrid.py, no frequent rows)", requires=("fused-sgd",),
                     excludes=("hybrid-embeddings",), rtol=1e-7,
                     select=lambda wl, _: setattr(wl.impl, "frequent_threshold", math.inf)),
        Optimisation("fused-lookups", "hybrid lookups as one Triton kernel from a per-lookup "
                     "code in the index plan; backward keeps the output's gradient, the rare "
                     "update reads it in place, the frequent rows' gradient summed over sorted "
                     "chunks (lookups_triton.py)",
                     requires=("triton-sparse-sgd", "hybrid-embeddings"), cuda=True,
                     compare=None, tested_by="tests/benchmarks/dlrm/test_lookups_triton.py",
                     apply=lambda wl, _: lookups_triton.apply(wl.emb)),
        Optimisation("bf16-tables", "rare embedding rows kept in bf16 only, no fp32 masters "
                     "(a third of the tables' memory): each step sums a row's gradients and "
                     "rounds the row stochastically; with fused-lookups one Triton kernel over "
                     "the index plan's runs (bf16_tables.py)",
                     requires=("fused-sgd", "hybrid-embeddings"), precisions=("amp-bf16",),
                     compare=None, tested_by="tests/benchmarks/dlrm/test_bf16_tables.py",
                     select=lambda wl, _: setattr(wl.impl, "rare_dtype", torch.bfloat16),
                     apply=_bf16_tables),
        Optimisation("split-linear", "each MLP layer's weight gradients on a side CUDA stream "
                     "beside its data gradient (split_linear.py)", apply=_split_linear,
                     rtol=1e-7),
        Optimisation("aligned-dense", "the bottom MLP's input, the interaction's vectors and "
                     "the top MLP's input padded with zeros to multiples of 8 (aligned GEMMs; "
                     "aligned.py)", apply=lambda wl, _: aligned.apply(wl.dense_arch),
                     excludes=("split-linear",), rtol=1e-5),
        Optimisation("interaction-backward", "the interaction's pairwise products with a "
                     "backward of one batched product: their gradient written at both of each "
                     "pair's places, (G + G^T) Z, in place of two products and a sum "
                     "(interaction.py)", apply=lambda wl, _: interaction.apply(wl.dense_arch),
                     rtol=1e-6),
        shared(COMPILE, apply=_compile, description="torch.compile the dense part: the bottom "
               "MLP, and the interaction with the top MLP (=MODE: default, tuned, "
               "max-autotune-no-cudagraphs)"),
        shared(CUDA_GRAPH, requires=("fused-lookups",)),
        Optimisation("prefetch", "the next batches read, copied to the device and their index "
                     "plans computed there (own stream) by four threads during the step",
                     compare="batches",
                     apply=lambda wl, _: setattr(wl, "prefetch", True)),
        Optimisation("cache-eval", "evaluation batches kept on the device after the first "
                     "evaluation (ids as int32: 160 bytes a sample, 14.3 GB for Criteo's 89M; "
                     "index plans computed at use)", compare=None, apply=lambda wl, _: setattr(
                         wl, "cache_eval", True),
                     tested_by="tests/benchmarks/dlrm/test_run_and_time.py"))

    @property
    def keeps_eval_batches(self) -> bool:
        return self.cache_eval

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help=f"folder with {data.TRAIN_FILE}, {data.EVAL_FILE}, {data.COUNTS_FILE} "
                            f"(--synthetic-data: Criteo Terabyte's table sizes, power-law ids)")
        p.add_argument("--stats-batches", type=checked(int, positive), default=20,
                       help="training batches counted for hybrid-embeddings' frequent rows")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, hp, env = self.args, self.hp, self.env
        threshold = getattr(self.impl, "frequent_threshold", None)   # None: EmbeddingBags
        if a.precision == "amp-fp16":
            raise UserError("dlrm trains with plain SGD and no loss scaling: use --precision "
                            "amp-bf16, tf32 or fp32")
        if hp.batch_size < env.world_size or hp.eval_batch_size < env.world_size:
            raise UserError(f"--batch-size {hp.batch_size} / --eval-batch-size "
                            f"{hp.eval_batch_size} must give every one of {env.world_size} "
                            f"ranks at least one sample")
        if threshold is None and env.distributed:
            raise UserError("one nn.EmbeddingBag a table is the single-process reference; with "
                            "several processes add --opt fused-sgd,hybrid-embeddings "
                            "(hybrid-embeddings=0 replicates every row)")
        bottom, top = parse_mlp(hp.arch_mlp_bot), parse_mlp(hp.arch_mlp_top)
        # synthetic ids (throughput runs, --init-steps warm-up): the same on every rank
        self.synthetic_rng = torch.Generator().manual_seed(a.seed)
        if self.synthetic:
            self.sizes = data.cap_sizes(data.CRITEO_TB_SIZES, hp.max_ind_range)
            self.steps_per_epoch = CRITEO_TRAIN_SAMPLES // hp.batch_size
        else:
            self._open_data()
        self.interval = max(1, int(hp.eval_every * self.steps_per_epoch))
        self.units_per_epoch = self.steps_per_epoch // self.interval
        self.bounds = data.split_bounds(hp.batch_size, env.world_size)
        self.tensor_names = mllog_tensor_names(bottom, top)
        try:
            self.dense_arch = DenseArch(hp.embedding_dim, data.NUM_SPARSE, bottom, top)
        except ValueError as exc:
            raise UserError(f"--arch-mlp-bot/--arch-mlp-top: {exc}") from None
        self.dense_arch.to(env.device)
        dist.broadcast_module(self.dense_arch)   # the replicas start alike (no DDP here)
        dev = env.device
        if threshold is None:
            self.emb = PlainEmbeddings(self.sizes, hp.embedding_dim, a.seed, dev)
        else:
            n = a.stats_batches * hp.batch_size
            stats = (data.power_law_ids(n, self.sizes, self.synthetic_rng) if self.synthetic
                     else self.train_log.read(0, min(self.train_log.num_records, n)).sparse)
            frequent = frequent_rows(stats, self.sizes, threshold)
            self.emb = HybridEmbedding(self.sizes, hp.embedding_dim, frequent, env.rank,
                                       env.world_size, a.seed, dev, rare_dtype=getattr(
                                           self.impl, "rare_dtype", torch.float32))
            say(f"dlrm: {frequent.numel()} of {sum(self.sizes)} embedding rows frequent "
                f"(replicated), the rest sharded over {env.world_size} rank(s)", env.is_main)
        self.optimizer = torch.optim.SGD(list(self.dense_arch.parameters())
                                         + list(self.emb.parameters()), lr=0.0)
        self.update = self._sgd_update
        self.step_count = torch.zeros((), device=dev)
        self.lr = torch.zeros((), device=dev)
        self._eval_cache: list | None = None

    def _open_data(self) -> None:
        a, hp = self.args, self.hp
        self.sizes = data.table_sizes(a.data_dir, hp.max_ind_range)
        self.train_log, self.eval_log = (data.BinaryClickLog(a.data_dir / f, self.sizes,
                                                             hp.max_ind_range)
                                         for f in (data.TRAIN_FILE, data.EVAL_FILE))
        self.train_sched = data.BatchSchedule(self.train_log, hp.batch_size, drop_last=True)
        self.eval_sched = data.BatchSchedule(self.eval_log, hp.eval_batch_size, drop_last=False)
        self.steps_per_epoch = self.train_sched.num_batches
        if self.steps_per_epoch < 1:
            raise UserError(f"{self.train_log.path}: {self.train_log.num_records} records are "
                            f"fewer than one global batch ({hp.batch_size}); lower --batch-size")

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (power-law ids over Criteo Terabyte's tables, device-resident)"
        n = self.train_log.num_records
        record = fixture_cache.recorded(self.args.data_dir)
        if fixture_cache.kind(self.args.data_dir) == data.STANDIN_KIND:
            return (f"stand-in: Criteo Terabyte's table sizes, power-law ids and random clicks "
                    f"from benchmarks.dlrm.standin, not Criteo ({n} train clicks)")
        if record is not None:
            oracle = record.get("oracle_auc")
            return (f"fixture: synthetic click logs in the Criteo Terabyte binary format from "
                    f"benchmarks.dlrm.fixture, not Criteo ({n} train clicks; planted model's "
                    f"own AUC {oracle})")
        if n == CRITEO_TRAIN_SAMPLES:
            return "criteo terabyte (days 0-22 train, day 23 test half)"
        return f"Criteo-format click logs {self.args.data_dir} ({n} train clicks)"

    @property
    def global_batch_size(self) -> int:
        return self.hp.batch_size

    @property
    def train_samples(self) -> int:
        return CRITEO_TRAIN_SAMPLES if self.synthetic else self.train_log.num_records

    @property
    def eval_samples(self) -> int:
        return CRITEO_EVAL_SAMPLES if self.synthetic else self.eval_log.num_records

    def hyperparameters(self) -> dict:
        a, c = self.hp, constants
        return {c.OPT_NAME: "sgd", c.GRADIENT_ACCUMULATION_STEPS: 1,
                c.OPT_BASE_LR: a.lr, c.OPT_LR_WARMUP_STEPS: a.warmup_steps,
                "lr_decay_start_steps": a.decay_start_step,
                "sgd_opt_base_learning_rate": a.lr,
                "sgd_opt_learning_rate_decay_poly_power": a.poly_power,
                "sgd_opt_learning_rate_decay_steps": a.decay_steps}

    # -- schedule: every --eval-every of an epoch, in fractional epochs -------------------
    def eval_points(self) -> list[EvalPoint]:
        spe = self.steps_per_epoch
        ends = [k * self.interval for k in range(1, self.units_per_epoch)] + [spe]
        steps = [e * spe + end for e in range(self.hp.epochs) for end in ends]
        # 1-based, as the reference logs it ((j + 1) / len(train_ld) + k + 1) and the RCPs
        # count: the end of the first epoch is epoch_num 2
        return interval_points(steps, lambda step: round(1 + step / spe, 6), start=1)

    def epoch_batches(self, epoch: int) -> _Epoch:
        return _Epoch(self, self.train_sched.ranges(epoch - 1, self.args.seed, self.hp.shuffle))

    def capture_policy(self) -> CapturePolicy:
        if "fused-lookups" not in self.opts:
            return CapturePolicy("never", reason="the index plan's sizes (and on several ranks "
                                 "the all-to-all's splits) change every step")
        if self.env.world_size == 1:
            return CapturePolicy("static")   # its one-rank plan: sizes fixed by the batch
        # one graph an exchange capacity (lookups_triton.exchange_capacity); a rare capacity
        # beyond them runs eagerly
        return CapturePolicy("bucketed", max_graphs=EXCHANGE_GRAPHS, eager_beyond=True)

    @property
    def rank_batch_size(self) -> int:
        return self.hp.batch_size   # synthetic_batch takes the global batch

    def training_state(self) -> list[torch.Tensor]:
        state = [*self.dense_arch.state_dict(keep_vars=True).values(), self.step_count, self.lr]
        if isinstance(self.emb, HybridEmbedding):
            e = self.emb
            return state + [t for t in (e.freq_weight, e.rare_weight, e.freq_lp, e.rare_lp)
                            if t is not None]
        return state + list(self.emb.state_dict(keep_vars=True).values())

    def warm_up_state(self, batches: list[tuple]) -> list[tuple[torch.Tensor, torch.Tensor | None]]:
        """Hybrid embeddings' rare tables (most of the state: tens of GB) change only in the
        rows the batches' plans update; the rest whole."""
        state = super().warm_up_state(batches)
        if not isinstance(self.emb, HybridEmbedding):
            return state
        rows = torch.unique(torch.cat([self.emb.rare_rows(idx) for *_, idx in batches]))
        rows = rows[rows >= 0]   # -1: a frequent lookup or padding, which no update touches
        rare = {id(self.emb.rare_weight), id(self.emb.rare_lp)}
        return [(t, rows if id(t) in rare else None) for t, _ in state]

    # -- data -----------------------------------------------------------------------------
    def prepare(self, start: int, stop: int, log: data.BinaryClickLog | None = None):
        """(dense, labels, plan or ids) of this rank for the global batch ``[start, stop)``,
        on the device."""
        return self.to_device(self.prepare_host(start, stop, log))

    def prepare_host(self, start: int, stop: int, log: data.BinaryClickLog | None = None):
        """:meth:`prepare`'s batch in host memory (pinned for CUDA); no device work, so it
        may run in another thread."""
        return self._host_slice((log or self.train_log).read(start, stop))

    def _bounds(self, n: int) -> list[int]:
        """The sample offsets of each rank's slice of a global batch of ``n``."""
        return self.bounds if n == self.hp.batch_size else data.split_bounds(n, self.env.world_size)

    def _host_slice(self, batch: data.Batch):
        """This rank's slice of a global batch, in host memory (for hybrid, the whole batch's
        ids: :meth:`to_device` plans them)."""
        bounds = self._bounds(batch.labels.numel())
        lo, hi = bounds[self.env.rank], bounds[self.env.rank + 1]
        dense, labels = batch.dense[lo:hi], batch.labels[lo:hi]
        idx = batch.sparse if isinstance(self.emb, HybridEmbedding) else batch.sparse[lo:hi]
        if self.env.device.type == "cuda":
            dense, labels, idx = dense.pin_memory(), labels.pin_memory(), idx.pin_memory()
        return dense, labels, idx

    def to_device(self, batch):
        """A :meth:`prepare_host` batch copied to the device on the current stream, with its
        index plan for hybrid (computed there)."""
        dense, labels, ids = self._move(batch)
        return dense, labels, self._index(ids)

    def _move(self, batch):
        dev = self.env.device
        move = dict(device=dev, non_blocking=dev.type == "cuda")
        return tuple(x.to(**move) for x in batch)

    def _index(self, ids: torch.Tensor):
        """What the embeddings take for the moved ``ids``: their index plan for hybrid (the
        whole batch's ids), else the ids."""
        ids = ids.long()
        if isinstance(self.emb, HybridEmbedding):
            return self.emb.plan(ids, self._bounds(ids.shape[0]))
        return ids

    # -- steps ----------------------------------------------------------------------------
    def _forward(self, dense: torch.Tensor, idx) -> torch.Tensor:
        with self.precision.autocast():
            if isinstance(self.emb, HybridEmbedding):
                emb, bottom = self.emb(idx, overlap=lambda: self.dense_arch.bottom_mlp(dense))
            else:
                bottom, emb = self.dense_arch.bottom_mlp(dense), self.emb(idx)
            return self.dense_arch(bottom, emb).float()

    def train_step(self, dense: torch.Tensor, labels: torch.Tensor, idx) -> torch.Tensor:
        a = self.hp
        self.lr.copy_(lr_at(self.step_count, a.lr, a.warmup_steps, a.decay_start_step,
                            a.decay_steps, a.poly_power))
        loss = F.binary_cross_entropy_with_logits(self._forward(dense, idx), labels,
                                                  reduction="sum")
        (loss / a.batch_size).backward()     # the gradient of the global batch's mean loss
        self.update()
        self.step_count += 1
        return loss.detach() / labels.numel()

    def _sgd_update(self) -> None:
        """The reference's update: ``torch.optim.SGD`` at this step's learning rate."""
        for g in self.optimizer.param_groups:
            g["lr"] = float(self.lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def evaluate(self) -> dict[str, float]:
        """Exact AUC over the whole test file (scores gathered from every rank). Batches are
        read as they are scored, or, with ``cache-eval``, kept on the device from the first
        evaluation on, their ids as int32."""
        ranges = self.eval_sched.ranges(0, 0, shuffle=False)
        batches = ((start, stop, self._move(self.prepare_host(start, stop, self.eval_log)))
                   for start, stop in ranges)
        if self.cache_eval:
            if self._eval_cache is None:
                self._eval_cache = [(start, stop, (dense, lab, ids.int()))
                                    for start, stop, (dense, lab, ids) in batches]
            batches = self._eval_cache
        self.dense_arch.eval()
        scores = torch.zeros(self.eval_samples, device=self.env.device)
        labels = torch.zeros(self.eval_samples, device=self.env.device)
        for start, stop, (dense, lab, ids) in batches:
            bounds = data.split_bounds(stop - start, self.env.world_size)
            lo = start + bounds[self.env.rank]
            scores[lo:lo + lab.numel()] = self._forward(dense, self._index(ids))
            labels[lo:lo + lab.numel()] = lab
        self.dense_arch.train()
        if self.env.distributed:
            dist.all_reduce_sum(scores)   # each sample is scored by exactly one rank
            dist.all_reduce_sum(labels)
        return {"auc": roc_auc(scores.cpu(), labels.cpu())}

    def warm_up_eval(self) -> None:
        """With ``compile``, the evaluation forward compiled before the clock, on synthetic
        batches of two sizes: the global evaluation batch's and half of it (the test file's
        last batch is shorter; the second size builds the graph that takes any size)."""
        if "compile" not in self.opts:
            return
        self.dense_arch.eval()
        for n in (self.hp.eval_batch_size, max(self.hp.eval_batch_size // 2,
                                                self.env.world_size)):
            dense, _, idx = self.to_device(self._host_slice(
                data.synthetic_batch(n, self.sizes, self.synthetic_rng)))
            self._forward(dense, idx)
        self.dense_arch.train()

    # -- throughput harness ---------------------------------------------------------------
    @property
    def flops_per_sample(self) -> float:
        """Training FLOPs per sample of the MLPs and the interaction (3x the forward matmuls)."""
        bottom, top = parse_mlp(self.hp.arch_mlp_bot), parse_mlp(self.hp.arch_mlp_top)
        d, n = self.hp.embedding_dim, data.NUM_SPARSE + 1
        widths_top = [d + n * (n - 1) // 2] + top
        mlp = sum(i * o for w in (bottom, widths_top) for i, o in zip(w[:-1], w[1:]))
        return 3 * 2 * (mlp + n * n * d)

    def synthetic_batch(self, batch_size: int):
        """This rank's share of a synthetic global batch (every rank draws the same one), with
        its index plan, on the device. DLRM's ``--batch-size`` is global: ``batch_size`` must
        equal it, so the loss scale and the samples counted match the batch."""
        if batch_size != self.hp.batch_size:
            raise UserError(f"dlrm's synthetic batch is the global --batch-size "
                            f"{self.hp.batch_size}, not {batch_size}: pass the same value")
        return self.to_device(self._host_slice(
            data.synthetic_batch(batch_size, self.sizes, self.synthetic_rng)))

    def infer_step(self, dense, labels, idx) -> torch.Tensor:
        with torch.no_grad():
            return self._forward(dense, idx)

