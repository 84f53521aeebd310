"""``--bind-cpus``: CPU lists, each GPU's NUMA-local CPUs from sysfs, and each local rank's own
slice of them (no two ranks on one core), with one-line errors where it cannot bind."""

import pytest
import torch

from common import cpu_binding, dist
from common.errors import UserError


@pytest.mark.parametrize("text, cpus", [("0-3,8,10-11\n", [0, 1, 2, 3, 8, 10, 11]),
                                        ("5", [5]), ("", []), ("0-1,64-65", [0, 1, 64, 65])])
def test_cpulists_parse_and_format_back(text, cpus):
    assert cpu_binding.parse_cpulist(text) == cpus
    assert cpu_binding.parse_cpulist(cpu_binding.format_cpulist(cpus)) == cpus
    assert cpu_binding.format_cpulist([3, 0, 1, 2, 7]) == "0-3,7"


def test_each_rank_gets_its_own_slice_of_the_usable_local_cpus():
    node = range(16)
    slices = [cpu_binding.share(node, range(64), i, 3) for i in range(3)]
    assert slices == [list(range(0, 5)), list(range(5, 10)), list(range(10, 15))]
    # only what this process may use (a container's or launcher's mask) is shared out
    assert cpu_binding.share(node, [1, 3, 5, 7, 40], 1, 2) == [5, 7]
    with pytest.raises(UserError, match="3 ranks share a GPU's 2 usable local CPUs"):
        cpu_binding.share(node, [1, 40, 3], 0, 3)


def fake_sysfs(tmp_path, lists):
    for bus, text in lists.items():
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "local_cpulist").write_text(text)
    return tmp_path


def test_a_gpus_local_cpus_come_from_its_pci_device(tmp_path):
    sysfs = fake_sysfs(tmp_path, {"0000:1b:00.0": "0-7,32-39\n", "0000:9a:00.0": "\n"})
    assert cpu_binding.gpu_cpus("0000:1B:00.0", sysfs) == [*range(8), *range(32, 40)]
    with pytest.raises(UserError, match="0000:9a:00.0/local_cpulist: lists no CPUs"):
        cpu_binding.gpu_cpus("0000:9a:00.0", sysfs)
    with pytest.raises(UserError, match="0000:00:01.0/local_cpulist: cannot read"):
        cpu_binding.gpu_cpus("0000:00:01.0", sysfs)


def test_a_gpus_pci_address_from_torch_or_the_drivers_files(tmp_path, monkeypatch):
    from types import SimpleNamespace
    with_pci = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0, uuid="x")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: with_pci)
    assert cpu_binding.bus_id(0, tmp_path) == "0000:1b:00.0"
    for bus, uuid in [("0000:18:00.0", "GPU-aaaa-1"), ("0000:9A:00.0", "GPU-bbbb-2")]:
        (tmp_path / bus).mkdir()
        (tmp_path / bus / "information").write_text(
            f"Model: \t\t NVIDIA H100\nGPU UUID: \t {uuid}\nBus Location: \t {bus}\n")
    monkeypatch.setattr(torch.cuda, "get_device_properties",
                        lambda i: SimpleNamespace(uuid=["aaaa-1", "BBBB-2", "cccc-3"][i]))
    assert cpu_binding.bus_id(1, tmp_path) == "0000:9a:00.0"
    assert cpu_binding.bus_id(0, tmp_path) == "0000:18:00.0"
    with pytest.raises(UserError, match="no GPU with UUID cccc-3"):
        cpu_binding.bus_id(2, tmp_path)


def test_ranks_sharing_a_node_split_it(tmp_path, monkeypatch):
    """4 GPUs, two on each socket's 16 CPUs: local rank 1 takes the second half of socket
    0's CPUs, local rank 2 the first half of socket 1's."""
    buses = ["0000:18:00.0", "0000:2a:00.0", "0000:9a:00.0", "0000:ab:00.0"]
    sysfs = fake_sysfs(tmp_path, dict(zip(buses, ["0-15", "0-15", "16-31", "16-31"])))
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(cpu_binding, "bus_id", buses.__getitem__)
    monkeypatch.setattr(cpu_binding.os, "sched_getaffinity", lambda pid: set(range(32)))
    bound = {}
    monkeypatch.setattr(cpu_binding.os, "sched_setaffinity",
                        lambda pid, cpus: bound.update({pid: list(cpus)}))
    cuda = torch.device("cuda", 0)
    assert cpu_binding.bind(cuda, 1, 4, sysfs) == list(range(8, 16)) == bound[0]
    assert cpu_binding.bind(cuda, 2, 4, sysfs) == list(range(16, 24)) == bound[0]
    # one rank alone on its node takes all of it
    assert cpu_binding.bind(cuda, 0, 1, sysfs) == list(range(16))


def test_binding_needs_a_gpu_and_says_so_in_one_line(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    with pytest.raises(UserError, match="--bind-cpus places each rank next to its GPU: run "
                                        "with --device cuda, or run without --bind-cpus"):
        dist.init_distributed("cpu", bind_cpus=True)

