"""The MLPerf training system description (``systems/<system>.json``) read from this machine.

Every field the 1.1.0 system-description checker requires is either detected
(processor, memory, accelerators, software versions) or given by the user;
a field that is neither is reported as missing, never guessed. Fields the
tools read as a choice or a number are validated here: the 1.1.0 checker
passes any value, and the result summarizer stops on a count it cannot read.
"""

from __future__ import annotations

import os
import platform
import re
import shutil
import subprocess
from pathlib import Path

from common.errors import UserError

# The fields mlperf_logging's system_desc_checker requires (training 1.1.0), in its order.
REQUIRED_FIELDS = (
    "submitter", "division", "status", "system_name", "number_of_nodes",
    "host_processors_per_node", "host_processor_model_name", "host_processor_core_count",
    "host_processor_vcpu_count", "host_processor_frequency", "host_processor_caches",
    "host_processor_interconnect", "host_memory_capacity", "host_storage_type",
    "host_storage_capacity", "host_networking", "host_networking_topology",
    "host_memory_configuration", "accelerators_per_node", "accelerator_model_name",
    "accelerator_host_interconnect", "accelerator_frequency", "accelerator_on-chip_memories",
    "accelerator_memory_configuration", "accelerator_memory_capacity",
    "accelerator_interconnect", "accelerator_interconnect_topology", "cooling", "hw_notes",
    "framework", "other_software_stack", "operating_system", "sw_notes",
)
# mllog submission_status -> the availability wording of the system descriptions.
STATUS = {"onprem": "Available on-premise", "cloud": "Available cloud", "preview": "Preview",
          "research": "Research, Development, or Internal (RDI)"}
# Accelerator fields that do not apply to a machine without accelerators.
ACCELERATOR_FIELDS = tuple(f for f in REQUIRED_FIELDS if f.startswith("accelerator_"))
DIVISIONS = ("closed", "open")


def _whole(value, least: int) -> bool:
    return re.fullmatch(r"[0-9]+", str(value)) is not None and int(value) >= least


# field -> (test, what the value must be). status: the wordings the system-description checker
# enforces from ruleset 4.0 on. The result summarizer multiplies the counts with int(); a
# machine without accelerators has 0 of them.
FIELD_VALUES = {
    "division": (lambda v: v in DIVISIONS, " or ".join(DIVISIONS)),
    "status": (lambda v: v in STATUS.values(), "one of " + "; ".join(STATUS.values())),
    **{f: (lambda v: _whole(v, 1), "a positive whole number") for f in (
        "number_of_nodes", "host_processors_per_node", "host_processor_core_count",
        "host_processor_vcpu_count")},
    "accelerators_per_node": (lambda v: _whole(v, 0), "a whole number (0: no accelerators)"),
}


def _cpuinfo() -> list[dict[str, str]]:
    text = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").is_file() else ""
    procs = []
    for block in text.strip().split("\n\n"):
        entry = {}
        for line in block.splitlines():
            key, _, value = line.partition(":")
            entry[key.strip()] = value.strip()
        if entry:
            procs.append(entry)
    return procs


def _cache_sizes() -> str | None:
    """``L1d 32K, L1i 32K, L2 512K, L3 32768K`` per core from sysfs, as the kernel reports them."""
    root = Path("/sys/devices/system/cpu/cpu0/cache")
    parts = []
    for index in sorted(root.glob("index*")):
        try:
            level = (index / "level").read_text().strip()
            kind = (index / "type").read_text().strip()
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        suffix = {"Data": "d", "Instruction": "i"}.get(kind, "")
        parts.append(f"L{level}{suffix} {size}")
    return ", ".join(parts) or None


def _max_mhz() -> str | None:
    path = Path("/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq")
    if path.is_file():
        return f"{int(path.read_text()) // 1000} MHz"
    return None


def _mem_total() -> str | None:
    meminfo = Path("/proc/meminfo")
    if not meminfo.is_file():
        return None
    m = re.search(r"MemTotal:\s+(\d+) kB", meminfo.read_text())
    return f"{int(m.group(1)) / 2**20:.0f} GiB" if m else None


def _os_name() -> str:
    release = Path("/etc/os-release")
    name = platform.system()
    if release.is_file():
        m = re.search(r'^PRETTY_NAME="?([^"\n]+)"?', release.read_text(), re.M)
        if m:
            name = m.group(1)
    return f"{name}, kernel {platform.release()}"


def _nvidia_smi(query: str) -> list[str]:
    exe = shutil.which("nvidia-smi")
    if not exe:
        return []
    try:
        out = subprocess.run([exe, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return []
    return [line.strip() for line in out.splitlines() if line.strip()]


def host_fields() -> dict:
    procs = _cpuinfo()
    fields: dict = {"host_processor_vcpu_count": os.cpu_count()}
    if procs:
        fields["host_processor_model_name"] = procs[0].get("model name")
        sockets = {p.get("physical id") for p in procs if "physical id" in p}
        fields["host_processors_per_node"] = len(sockets) or None
        cores = procs[0].get("cpu cores")
        fields["host_processor_core_count"] = int(cores) if cores else None
    fields["host_processor_frequency"] = _max_mhz()
    fields["host_processor_caches"] = _cache_sizes()
    fields["host_memory_capacity"] = _mem_total()
    fields["operating_system"] = _os_name()
    return {k: v for k, v in fields.items() if v is not None}


def accelerator_fields() -> dict:
    """GPU fields from torch and nvidia-smi; "N/A" throughout when the machine has no GPU."""
    import torch

    if not torch.cuda.is_available():
        return {"accelerators_per_node": 0, **{f: "N/A" for f in ACCELERATOR_FIELDS}}
    props = torch.cuda.get_device_properties(0)
    fields: dict = {
        "accelerators_per_node": torch.cuda.device_count(),
        "accelerator_model_name": props.name,
        "accelerator_memory_capacity": f"{props.total_memory / 2**30:.0f} GiB",
    }
    l2 = getattr(props, "L2_cache_size", 0)
    if l2:
        fields["accelerator_on-chip_memories"] = f"L2 {l2 / 2**20:.0f} MiB"
    clocks = _nvidia_smi("clocks.max.sm")
    if clocks:
        fields["accelerator_frequency"] = f"{clocks[0]} MHz"
    pcie = _nvidia_smi("pcie.link.gen.max,pcie.link.width.max")
    if pcie and "," in pcie[0]:
        gen, width = (x.strip() for x in pcie[0].split(","))
        fields["accelerator_host_interconnect"] = f"PCIe Gen{gen} x{width}"
    return fields


def software_fields() -> dict:
    import torch

    cuda = torch.version.cuda
    framework = f"PyTorch {torch.__version__}" + (f", CUDA {cuda}" if cuda else " (CPU)")
    stack = [f"Python {platform.python_version()}"]
    if torch.cuda.is_available():
        stack.append(f"cuDNN {torch.backends.cudnn.version()}")
        if torch.cuda.nccl.is_available([]):
            stack.append("NCCL " + ".".join(map(str, torch.cuda.nccl.version())))
        driver = _nvidia_smi("driver_version")
        if driver:
            stack.append(f"NVIDIA driver {driver[0]}")
    try:
        from importlib.metadata import version
        stack.append(f"mlperf-logging {version('mlperf-logging')}")
    except Exception:  # not installed as a distribution: leave it out
        pass
    return {"framework": framework, "other_software_stack": ", ".join(stack)}


def detect() -> dict:
    """Every field this machine can tell about itself (the rest must come from the user)."""
    return {**host_fields(), **accelerator_fields(), **software_fields(), "number_of_nodes": 1}


def missing_fields(desc: dict) -> list[str]:
    return [f for f in REQUIRED_FIELDS if desc.get(f) in (None, "")
            and f not in ("hw_notes", "sw_notes")]


def validate(desc: dict, name: str, where: str, fix: str) -> None:
    """Refuse (``UserError``: where, the field, fix) a value the tools would misread.

    ``name`` is the system's in the tree (results/<name>, systems/<name>.json); a field
    that is absent is left to ``missing_fields`` and the system-description checker.
    """
    problems = [f"{f}={desc[f]!r} is not {what}" for f, (ok, what) in FIELD_VALUES.items()
                if f in desc and not ok(desc[f])]
    if desc.get("system_name", name) != name:
        problems.insert(0, f"system_name={desc['system_name']!r} is not the system's name "
                           f"in the tree, {name!r}")
    if problems:
        more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
        raise UserError(f"{where}: {problems[0]}{more}: {fix}")


def describe(given: dict, detected: dict | None = None) -> dict:
    """The system description: user-given fields over detected ones, in the checker's order.

    Values are strings, as in MLCommons' published descriptions (the checker joins them).
    """
    detected = detect() if detected is None else detected
    merged = {**detected, **{k: v for k, v in given.items() if v is not None}}
    merged.setdefault("hw_notes", "")
    merged.setdefault("sw_notes", "")
    ordered = {f: merged[f] for f in REQUIRED_FIELDS if f in merged}
    ordered.update({k: v for k, v in merged.items() if k not in ordered})
    return {k: str(v) for k, v in ordered.items()}
