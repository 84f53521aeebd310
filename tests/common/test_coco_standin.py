"""``common.coco.standin``: COCO 2017's scale and shapes in the fixture's format, for dry
runs; the same output for any number of writer processes."""

import json
import signal
import subprocess
import sys
import time

import pytest
from pycocotools.coco import COCO

from common.coco import data, standin
from tests.entry_points import REPO


def test_a_fraction_of_cocos_scale_in_its_format(tmp_path):
    one = standin.write_standin(tmp_path / "one", fraction=0.0002, workers=1)
    two = standin.write_standin(tmp_path / "two", fraction=0.0002, workers=2)
    for split, images in (("train", 24), ("val", 1)):   # 118,287 and 5,000 x 0.0002
        name = f"annotations/instances_{split}2017.json"
        assert (one / name).read_bytes() == (two / name).read_bytes()
        coco = COCO(str(one / name))
        assert len(coco.getImgIds()) == images and len(coco.getCatIds()) == 80
        for image in coco.loadImgs(coco.getImgIds()):
            assert max(image["width"], image["height"]) <= 640
            assert (one / f"{split}2017" / image["file_name"]).read_bytes() == \
                (two / f"{split}2017" / image["file_name"]).read_bytes()
    train = json.loads((one / "annotations/instances_train2017.json").read_text())
    assert 3 < len(train["annotations"]) / len(train["images"]) < 15   # COCO: 7.3 an image
    assert data.describe(one, 24, 1).startswith("stand-in: COCO-scale synthetic images")


def test_a_fraction_outside_zero_to_one_is_refused(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        standin.main([str(tmp_path / "x"), "--fraction", "2"])
    assert exit_.value.code == 2
    assert "must be more than 0 and at most 1, not 2.0" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_a_stop_while_the_writers_run_leaves_nothing_and_says_so(tmp_path):
    root = tmp_path / "coco"
    proc = subprocess.Popen([sys.executable, "-m", "common.coco.standin", str(root),
                             "--fraction", "0.05", "--workers", "2"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not any(p.name.startswith(".coco.") and any(p.rglob("*.jpg"))
                      for p in tmp_path.iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM
    assert stderr.splitlines() == [
        f"error: SIGTERM while writing the fixture {root}: stopped and the partial copy "
        f"removed; run the writer again"]
    assert list(tmp_path.iterdir()) == []
