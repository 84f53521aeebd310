"""Each rank on the CPU cores next to its GPU (``--bind-cpus``), as NVIDIA's MLPerf launchers
place them: a rank's cores are its GPU's NUMA-local CPUs (the PCI device's
``local_cpulist`` in sysfs) that this process may use, split evenly among the local ranks
whose GPUs share them, so no two ranks share a core. Loader processes started later inherit
the binding. Without the switch the operating system places every thread anywhere, and a
host-bound step can run on the far socket or beside another rank's threads."""

from __future__ import annotations

import os
from pathlib import Path

import torch

from common.errors import UserError, require_cuda

SYSFS = Path("/sys/bus/pci/devices")
PROC = Path("/proc/driver/nvidia/gpus")


def parse_cpulist(text: str) -> list[int]:
    """The CPUs of a kernel CPU list such as ``0-3,8,10-11``."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if part:
            first, _, last = part.partition("-")
            cpus.extend(range(int(first), int(last or first) + 1))
    return cpus


def format_cpulist(cpus) -> str:
    """The inverse of :func:`parse_cpulist`, runs written as ranges."""
    runs: list[list[int]] = []
    for cpu in sorted(cpus):
        if runs and cpu == runs[-1][1] + 1:
            runs[-1][1] = cpu
        else:
            runs.append([cpu, cpu])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def gpu_cpus(bus_id: str, sysfs: Path = SYSFS) -> list[int]:
    """The NUMA-local CPUs of the PCI device ``bus_id`` (``0000:1b:00.0``)."""
    path = sysfs / bus_id.lower() / "local_cpulist"
    try:
        cpus = parse_cpulist(path.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"{path}: cannot read the GPU's local CPUs ({exc}); run without "
                        "--bind-cpus") from exc
    if not cpus:
        raise UserError(f"{path}: lists no CPUs; run without --bind-cpus")
    return cpus


def share(node_cpus, allowed, index: int, count: int) -> list[int]:
    """Slice ``index`` of ``count`` equal slices of the CPUs in both ``node_cpus`` and
    ``allowed``."""
    usable = sorted(set(node_cpus) & set(allowed))
    if len(usable) < count:
        raise UserError(f"--bind-cpus: {count} ranks share a GPU's {len(usable)} usable local "
                        f"CPUs ({format_cpulist(usable) or 'none'}); run without --bind-cpus")
    per = len(usable) // count
    return usable[index * per:(index + 1) * per]


def bus_id(device_index: int, proc: Path = PROC) -> str:
    """The PCI address of CUDA device ``device_index`` as sysfs names it: from torch's device
    properties where they carry it, else the NVIDIA driver's file of the GPU with that UUID."""
    p = torch.cuda.get_device_properties(device_index)
    if hasattr(p, "pci_bus_id"):
        return f"{p.pci_domain_id:04x}:{p.pci_bus_id:02x}:{p.pci_device_id:02x}.0"
    uuid = str(p.uuid).lower().removeprefix("gpu-")
    for info in sorted(proc.glob("*/information")):
        for line in info.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "GPU UUID" and value.strip().lower().removeprefix("gpu-") == uuid:
                return info.parent.name.lower()
    raise UserError(f"{proc}: no GPU with UUID {uuid} (NVIDIA's driver files); run without "
                    "--bind-cpus")


def bind(device: torch.device, local_rank: int, local_world_size: int,
         sysfs: Path = SYSFS) -> list[int]:
    """Bind this process to its share of its GPU's local CPUs; the CPUs. Local rank ``r``
    drives CUDA device ``r % device_count`` (as :func:`common.dist.init_distributed`)."""
    require_cuda(device, "--bind-cpus places each rank next to its GPU",
                 "run without --bind-cpus")
    count = torch.cuda.device_count()
    nodes = [tuple(gpu_cpus(bus_id(r % count), sysfs)) for r in range(local_world_size)]
    sharing = [r for r, node in enumerate(nodes) if node == nodes[local_rank]]
    cpus = share(nodes[local_rank], os.sched_getaffinity(0), sharing.index(local_rank),
                 len(sharing))
    os.sched_setaffinity(0, cpus)
    return cpus

