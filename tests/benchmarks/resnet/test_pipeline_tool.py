"""The stage-timing tool on the CPU: its table, its JSON and its one-line refusals."""

import json

import pytest

from benchmarks.resnet import pipeline
from benchmarks.resnet.fixture import write_fixture


def test_cpu_stages_write_a_table_and_json(tmp_path, capsys):
    root = write_fixture(tmp_path / "fx", num_classes=2, train_per_class=6, val_per_class=2,
                         image_size=64)
    out = tmp_path / "stages.json"
    stages = ["read", "plan", "decode-pillow-draft", "decode-turbo", "crops-pillow",
              "crops-turbo", "regions-turbo", "turbo-train", "turbo-eval", "crop-resize"]
    assert pipeline.main([str(root), "--device", "cpu", "--stages", ",".join(stages),
                          "--workers", "0", "--eval-batch-size", "2", "--batch-size", "4",
                          "--image-size", "32", "--seconds", "0.2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert [r["stage"] for r in report["stages"]] == stages
    assert all(r["images_per_second"] > 0 for r in report["stages"])
    assert report["dataset"]["train_images"] == 12 and report["dataset"]["mean_width"] == 64
    assert "crop-resize" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--stages", "decode-nvjpeg"], "need a CUDA device"),
    (["--stages", "unzip"], "unknown stage(s) ['unzip']"),
    (["--workers", "eight"], "--workers 'eight'"),
])
def test_bad_flags_are_one_line_errors(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        pipeline.parse_args([str(tmp_path), "--device", "cpu", *args])
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_too_few_images_for_a_batch_is_named(tmp_path, capsys):
    root = write_fixture(tmp_path / "fx", num_classes=1, train_per_class=2, val_per_class=1,
                         image_size=16)
    assert pipeline.main([str(root), "--device", "cpu", "--stages", "read", "--workers", "0",
                          "--batch-size", "8", "--seconds", "0.1"]) == 2
    assert "fewer than one batch" in capsys.readouterr().err
