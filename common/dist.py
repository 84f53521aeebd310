"""torch.distributed set-up from torchrun or SLURM variables, and small collectives.

NCCL on CUDA, gloo on the CPU, so multi-process logic runs in CI on 2 CPU processes.
A collective waits at most ``collective_timeout()`` (5 minutes, ``COLLECTIVE_TIMEOUT_S``)
for its peers: a rank whose peer died without closing its connections fails then, not after
torch's 30 minutes (docs/multinode.md).
"""

from __future__ import annotations

import gc
import math
import os
import re
import sys
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from common.collectives import summed_over_group  # noqa: F401 (unet3d/spatial.py imports it here)

TIMEOUT_VARIABLE = "COLLECTIVE_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 300   # above the longest wait of a sound run: rank 0 scoring COCO
# a file that ``python -m common.launch`` names for its workers: a failing worker creates it
# before it exits, so a peer that torchrun then stops knows it was not stopped by the user
FAILED_MARK_VARIABLE = "MLPERF_LAUNCH_FAILED_MARK"


def collective_timeout() -> timedelta:
    """How long a collective (and the rendezvous) waits for every rank: ``COLLECTIVE_TIMEOUT_S``
    seconds, else ``DEFAULT_TIMEOUT_S``."""
    text = os.environ.get(TIMEOUT_VARIABLE, "")
    if not text:
        return timedelta(seconds=DEFAULT_TIMEOUT_S)
    if not text.isdigit() or int(text) == 0:
        from common.errors import UserError
        raise UserError(f"{TIMEOUT_VARIABLE}={text} is not a positive integer: set it to the "
                        f"seconds a collective may wait for its peers (default "
                        f"{DEFAULT_TIMEOUT_S})")
    return timedelta(seconds=int(text))


@dataclass
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    device: torch.device = torch.device("cpu")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


def _first_slurm_host(nodelist: str) -> str:
    """First host of a SLURM node list such as ``node[003-005,9],other``."""
    m = re.match(r"([^,\[]+)(?:\[([^\]]+)\])?", nodelist)
    if not m:
        return nodelist
    prefix, ranges = m.group(1), m.group(2)
    if not ranges:
        return prefix
    return prefix + ranges.split(",")[0].split("-")[0]


def _local_count(key: str, local_rank: int) -> int:
    """Ranks on this machine from the launcher's variable ``key``, at least ``local_rank + 1``
    (SLURM writes counts such as ``4(x2)``, which are not read)."""
    value = os.environ.get(key, "")
    return max(int(value) if value.isdigit() else 0, local_rank + 1)


def _env_from_launcher() -> tuple[int, int, int, int]:
    """(rank, world_size, local_rank, local_world_size) from torchrun, else SLURM, else a
    single process."""
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), local_rank,
                _local_count("LOCAL_WORLD_SIZE", local_rank))
    if "SLURM_PROCID" in os.environ and int(os.environ.get("SLURM_NTASKS", 1)) > 1:
        rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
        os.environ.setdefault("MASTER_ADDR", _first_slurm_host(os.environ["SLURM_JOB_NODELIST"]))
        os.environ.setdefault("MASTER_PORT", "29500")
        os.environ["RANK"], os.environ["WORLD_SIZE"] = str(rank), str(world)
        local_rank = int(os.environ.get("SLURM_LOCALID", 0))
        return rank, world, local_rank, _local_count("SLURM_NTASKS_PER_NODE", local_rank)
    return 0, 1, 0, 1


def follow_launcher() -> None:
    """Under torchrun, have the kernel send this worker SIGTERM when its agent dies (Linux's
    parent-death signal): torchrun starts each worker in a session of its own, so a node's
    agent killed (a lost node, ``kill -9``) would leave its workers training on with the
    other nodes. Stopped so, the worker logs run_stop aborted and its peers' collectives
    fail at once."""
    if "TORCHELASTIC_RUN_ID" not in os.environ or not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal
    parent = os.getppid()
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)   # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:   # the agent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def mark_failed() -> None:
    """Tell this launch's other workers that this one is failing (a no-op outside
    ``common.launch``)."""
    path = os.environ.get(FAILED_MARK_VARIABLE)
    if path:
        try:
            open(path, "a").close()
        except OSError:   # the launcher's folder gone: nobody left to tell
            pass


def peer_failed() -> bool:
    """Whether another worker of this launch failed: the SIGTERM torchrun then sends this
    one is its consequence, not a stop to report."""
    path = os.environ.get(FAILED_MARK_VARIABLE)
    return bool(path) and os.path.exists(path)


def launcher_rank() -> int:
    """This process's global rank as its launcher (torchrun, SLURM) numbers it, 0 without
    one; read before the process group exists, changing nothing."""
    for key in ("RANK", "SLURM_PROCID"):
        if os.environ.get(key, "").isdigit():
            return int(os.environ[key])
    return 0


def init_distributed(device: str = "auto", bind_cpus: bool = False) -> DistEnv:
    """Join the process group the launcher describes and pick this rank's device.

    ``device``: ``auto`` (CUDA when present), ``cuda`` or ``cpu``. ``bind_cpus``: first bind
    this process to its share of its GPU's local CPU cores (:mod:`common.cpu_binding`), so
    the communication library's threads start there too, and say which.
    """
    if device not in ("auto", "cuda", "cpu"):
        raise ValueError(f"device must be auto, cuda or cpu, not {device!r}")
    use_cuda = torch.cuda.is_available() if device == "auto" else device == "cuda"
    if use_cuda and not torch.cuda.is_available():
        from common.errors import UserError
        raise UserError("--device cuda was asked for but no CUDA device is visible")
    rank, world, local_rank, local_world = _env_from_launcher()
    timeout = collective_timeout()
    if use_cuda:
        torch.cuda.set_device(local_rank % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    if bind_cpus:
        from common import cpu_binding
        cpus = cpu_binding.bind(dev, local_rank, local_world)
        print(f"rank {rank}: bound to CPUs {cpu_binding.format_cpulist(cpus)}", flush=True)
    if world > 1 and not dist.is_initialized():
        if use_cuda:  # NCCL collectives inside captured CUDA graphs need this off
            os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")
        dist.init_process_group(
            backend="nccl" if use_cuda else "gloo",
            rank=rank, world_size=world, timeout=timeout,
            device_id=dev if use_cuda else None,
        )
    return DistEnv(rank=rank, world_size=world, local_rank=local_rank, device=dev)


def shutdown() -> None:
    """Destroy the process groups while the interpreter is fully alive.

    Callers drop their own references (the workload, its DDP module) first;
    ``gc.collect`` then frees whatever cycles still hold a group, so destroying
    it really joins gloo's worker threads (``gc.unfreeze`` first: objects that
    ``--gc-freeze`` moved out of the collector's reach would escape it). A group
    that outlives this call is destroyed during interpreter finalisation instead,
    where a gloo thread still holding a finished work's tensors can abort the process
    ("terminate called without an active exception").
    """
    if dist.is_initialized():
        gc.unfreeze()
        gc.collect()
        dist.destroy_process_group()


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def broadcast_module(module: torch.nn.Module, src: int = 0) -> None:
    """Rank ``src``'s parameters and buffers on every rank: the same initial weights for
    replicas that no DDP wrapper synchronises (a no-op on one process)."""
    if dist.is_initialized():
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t, src)


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """In-place sum across ranks (a no-op on one process)."""
    if dist.is_initialized():
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


def all_reduce_sum_async(t: torch.Tensor):
    """Start an in-place sum across ranks; the work to ``wait()`` on (None on one process).
    On CUDA the sum runs on NCCL's stream while the current stream goes on; ``wait()``
    makes the current stream wait for it."""
    if dist.is_initialized():
        return dist.all_reduce(t, op=dist.ReduceOp.SUM, async_op=True)
    return None


def all_reduce_sum_coalesced_async(tensors: list[torch.Tensor]):
    """:func:`all_reduce_sum_async` of every tensor of ``tensors`` as one coalesced collective
    (one NCCL group), with no concatenated copy of them to sum and split."""
    if not dist.is_initialized():
        return None
    # torch.distributed's coalescing manager is private (FSDP's way to group collectives)
    with dist.distributed_c10d._coalescing_manager(async_ops=True) as work:
        for t in tensors:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return work


def gather_rows(t: torch.Tensor) -> torch.Tensor | None:
    """Every rank's ``t`` concatenated along dim 0 in rank order on rank 0, None elsewhere.

    For results whose row count differs between ranks (and may be 0), such as
    the boxes each rank detects; see :func:`gather_row_dict`. A single process
    gets ``t`` back.
    """
    rows = gather_row_dict({"t": t})
    return None if rows is None else rows["t"]


def gather_row_dict(rows: dict[str, torch.Tensor]) -> dict[str, torch.Tensor] | None:
    """:func:`gather_rows` for tensors that share dim 0 (boxes [N, 4], scores [N], labels [N]).

    Collective: every rank calls it with the same keys, and each key's dtype and
    trailing shape the same on every rank; N may differ. The tensors travel on
    their device (CUDA under NCCL) in two all-gathers: the row counts, then the
    rows packed as bytes and padded to the largest count. A single process gets
    ``rows`` back.
    """
    if not dist.is_initialized():
        return rows
    tensors = list(rows.values())
    n = tensors[0].shape[0]
    if any(t.dim() == 0 or t.shape[0] != n for t in tensors):
        shapes = {k: tuple(t.shape) for k, t in rows.items()}
        raise ValueError(f"gather_row_dict: the tensors' dim 0 differ: {shapes}")
    count = torch.tensor([n], device=tensors[0].device)
    counts = [torch.empty_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    counts = [int(c) for c in counts]
    # each row's bytes of every tensor side by side, so one all-gather carries any dtypes
    packed = torch.cat([t.detach().reshape(n, math.prod(t.shape[1:])).contiguous()
                        .view(torch.uint8) for t in tensors], dim=1)
    if max(counts) == 0:  # nothing to send: skip a collective of empty tensors
        gathered = packed
    else:
        padded = packed.new_zeros(max(counts), packed.shape[1])
        padded[:n] = packed
        parts = [torch.empty_like(padded) for _ in counts]
        dist.all_gather(parts, padded)
        gathered = torch.cat([p[:c] for p, c in zip(parts, counts)])
    if dist.get_rank() != 0:
        return None
    out, start = {}, 0
    for key, t in rows.items():
        width = math.prod(t.shape[1:]) * t.element_size()
        # a fresh copy: viewing bytes as t.dtype needs an offset and row stride that are
        # multiples of its size (contiguous() keeps an empty slice's stride)
        raw = gathered[:, start:start + width].clone(memory_format=torch.contiguous_format)
        out[key] = raw.view(t.dtype).reshape(len(gathered), *t.shape[1:])
        start += width
    return out


def gather_objects(obj) -> list | None:
    """Every rank's picklable ``obj`` in rank order on rank 0, None elsewhere (results that
    are not tensors, such as RLE masks); a single process gets ``[obj]``."""
    if not dist.is_initialized():
        return [obj]
    out = [None] * dist.get_world_size() if dist.get_rank() == 0 else None
    dist.gather_object(obj, out, dst=0)
    return out


def broadcast_object(obj, src: int = 0):
    if not dist.is_initialized():
        return obj
    box = [obj]
    dist.broadcast_object_list(box, src=src)
    return box[0]


def data_parallel(model: torch.nn.Module, env: DistEnv) -> torch.nn.Module:
    """Average gradients across ranks with DDP (bucketed all-reduce overlapped with backward).

    Gradients live in DDP's buckets (``gradient_as_bucket_view``), so no copy
    separates backward from the all-reduce; a single process gets the model back.
    On CUDA, DDP is built on the stream whole-step graphs are captured on.
    """
    if not env.distributed:
        return model
    from torch.nn.parallel import DistributedDataParallel

    def build():
        return DistributedDataParallel(
            model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
            gradient_as_bucket_view=True, broadcast_buffers=False)
    if env.device.type != "cuda":
        return build()
    from common.cuda_graph import side_stream
    stream = side_stream(env.device)
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        ddp = build()
    torch.cuda.current_stream().wait_stream(stream)
    return ddp


def group_norm_layers(model: torch.nn.Module, env: DistEnv, group_size: int) -> torch.nn.Module:
    """Group batch norm: BN statistics reduced over ``group_size`` consecutive ranks.

    1 keeps per-rank BN. On CUDA the layers become ``nn.SyncBatchNorm`` (fused statistics
    and normalisation kernels, capturable in a CUDA graph); elsewhere
    ``common.group_bn.GroupBatchNorm2d``, the plain reference that also runs on gloo.
    MLPerf logs the span as ``model_bn_span``.
    """
    if group_size == 1 or not env.distributed:
        return model
    if env.world_size % group_size:
        from common.errors import UserError
        raise UserError(f"--bn-group {group_size} does not divide the {env.world_size} ranks")
    group, _ = dist.new_subgroups(group_size=group_size)
    if env.device.type == "cuda":
        return torch.nn.SyncBatchNorm.convert_sync_batchnorm(model, process_group=group)
    from common import group_bn
    return group_bn.convert(model, group)
