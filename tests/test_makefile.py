"""What `make venv` installs: the Makefile run with python faked (it records the pip
commands), with or without an ``nvidia-smi`` on PATH. Where one runs, the GPU configs'
``nvjpeg`` optimisation needs the torchvision built for the torch pin; on a CPU machine
torchvision must stay out (its wheels cannot import next to the CPU torch wheel).
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def torchvision_for(torch_version: str) -> str:
    """The torchvision release built for a torch release: torch 2.N.P pairs with torchvision
    0.(N+15).P (the wheels of torchvision 0.27.1, 0.28.0 and 0.29.0 require torch==2.12.1,
    ==2.13.0 and ==2.14.0)."""
    major, minor, patch = (int(v) for v in torch_version.split("+")[0].split("."))
    assert major == 2, f"torch {torch_version}: the pairing rule is for torch 2.x"
    return f"0.{minor + 15}.{patch}"


def make_venv(tmp_path: Path, nvidia_smi: bool, *variables: str) -> tuple[list[list[str]], str]:
    """The commands that `make venv` gives python (every pip call), and make's output."""
    make = shutil.which("make")
    if make is None:
        pytest.skip("needs make")
    calls = tmp_path / "calls.jsonl"
    python = tmp_path / "python"
    python.write_text(
        f"#!{sys.executable}\nimport json, os, sys\nargs = sys.argv[1:]\n"
        "if args[:2] == ['-m', 'venv']:\n    os.makedirs(args[2], exist_ok=True)\n"
        f"with open({str(calls)!r}, 'a') as f:\n    f.write(json.dumps(args) + '\\n')\n")
    python.chmod(0o755)
    path = tmp_path / "bin"   # PATH holds only this: no real nvidia-smi can leak in
    path.mkdir()
    os.symlink(shutil.which("touch"), path / "touch")
    if nvidia_smi:
        (path / "nvidia-smi").write_text("#!/bin/sh\nexit 0\n")
        (path / "nvidia-smi").chmod(0o755)
    proc = subprocess.run(
        [make, "-s", "-B", "-C", str(REPO), "venv", f"VENV={tmp_path / 'venv'}",
         f"PYTHON={python}", f"PY={python}", *variables],
        env={"PATH": str(path), "HOME": str(tmp_path)}, capture_output=True, text=True,
        timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return [json.loads(line) for line in calls.read_text().splitlines()], proc.stdout


def pip_installs(calls: list[list[str]]) -> list[list[str]]:
    return [c[3:] for c in calls if c[:3] == ["-m", "pip", "install"]]


def installed_requirements(calls) -> tuple[str, list[str]]:
    """(torch version, the requirements of the extras of the project's editable install)."""
    installs = pip_installs(calls)
    torch_pins = [a for args in installs for a in args if a.startswith("torch==")]
    assert len(torch_pins) == 1, installs
    editable = [args[args.index("-e") + 1] for args in installs if "-e" in args]
    assert len(editable) == 1, installs
    match = re.fullmatch(r"\.\[([\w,-]+)\]", editable[0])
    assert match, editable
    tomllib = pytest.importorskip("tomllib")
    extras = tomllib.loads((REPO / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    names = match.group(1).split(",")
    assert set(names) <= set(extras), f"{names}: not all in pyproject.toml's {sorted(extras)}"
    return torch_pins[0].split("==")[1], [r for n in names for r in extras[n]]


def torchvision_requirements(requirements: list[str]) -> list[str]:
    return [r for r in requirements if re.match(r"torchvision\b", r)]


def test_make_venv_installs_the_torchvision_of_the_torch_pin_where_nvidia_smi_runs(tmp_path):
    calls, _ = make_venv(tmp_path, nvidia_smi=True)
    torch_version, requirements = installed_requirements(calls)
    assert torchvision_requirements(requirements) == [
        f"torchvision=={torchvision_for(torch_version)}"], requirements
    assert any(r.startswith("nvidia-cudnn-frontend") for r in requirements), requirements


def test_make_venv_installs_no_torchvision_on_a_cpu_machine(tmp_path):
    calls, _ = make_venv(tmp_path, nvidia_smi=False)
    _, requirements = installed_requirements(calls)
    assert not torchvision_requirements(requirements), requirements
    assert not any("torchvision" in a for args in pip_installs(calls) for a in args), calls


def test_another_torch_spec_gets_no_torchvision_that_would_replace_it(tmp_path):
    calls, out = make_venv(tmp_path, True, "TORCH_SPEC=torch==2.11.0")
    torch_version, requirements = installed_requirements(calls)
    assert torch_version == "2.11.0"
    assert not torchvision_requirements(requirements), requirements
    assert any(r.startswith("nvidia-cudnn-frontend") for r in requirements), requirements
    assert "no torchvision installed" in out
