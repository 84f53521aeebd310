"""Every ``benchmarks/<name>/config_*.sh`` gives flags its workload's parser accepts."""

import subprocess
from pathlib import Path

import pytest

from common.bench.worker import workload_class
from common.training import build_parser

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted(REPO.glob("benchmarks/*/config_*.sh"))
# the variables configs require (${VAR:?...}) stand for real paths on a GPU machine
ENV = {"INIT_CHECKPOINT": "/ckpt/model.ckpt-28252.pt", "BACKBONE_CHECKPOINT": "/ckpt/resnet50.pt",
       "PATH": "/usr/bin:/bin"}


def config_args(path: Path) -> tuple[int, list[str]]:
    """NPROC and TRAIN_ARGS of a config, as ``run_and_time.sh`` sources them."""
    script = (f'NPROC=1; TRAIN_ARGS=(); source "{path}"; echo "$NPROC"; '
              f'printf "%s\\n" "${{TRAIN_ARGS[@]}}"')
    out = subprocess.run(["bash", "-c", script], env=ENV, capture_output=True, text=True,
                         check=True).stdout.splitlines()
    return int(out[0]), out[1:]


def test_every_workload_has_the_design_configs():
    names = {p.parent.name for p in CONFIGS}
    for name in names:
        have = {p.stem for p in CONFIGS if p.parent.name == name}
        assert {"config_cpu_tiny", "config_1xH100", "config_8xH200"} <= have, name


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_config_flags_parse(path):
    nproc, args = config_args(path)
    assert nproc >= 1
    parser = build_parser(workload_class(path.parent.name))
    parser.parse_args(["--data-dir", "/data", *args])   # exits on an unknown flag or bad value


@pytest.mark.parametrize("path", [p for p in CONFIGS if p.parent.name in ("ssd", "maskrcnn")
                                  and p.stem != "config_cpu_tiny"],
                         ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_detection_gpu_configs_start_from_an_imagenet_backbone(path):
    """The references start SSD's ResNet-34 and Mask R-CNN's ResNet-50 from ImageNet weights:
    their GPU configs pass BACKBONE_CHECKPOINT, and without it stop in one line naming it."""
    _, args = config_args(path)
    assert args[args.index("--backbone-checkpoint") + 1] == ENV["BACKBONE_CHECKPOINT"]
    proc = subprocess.run(["bash", "-c", f'source "{path}"'], env={"PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True)
    assert proc.returncode != 0
    assert "set BACKBONE_CHECKPOINT to a torchvision resnet" in proc.stderr
