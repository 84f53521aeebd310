"""common.fixture_cache: fixtures written whole or not at all, never over other files, and a
stop signal while writing said in one line with nothing left behind."""

import importlib
import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from common.errors import UserError
from common.fixture_cache import MARKER, cached_fixture
from tests.entry_points import REPO, error_lines, run_script

WRITERS = ["common.coco.fixture", "benchmarks.resnet.fixture", "benchmarks.bert.fixture",
           "benchmarks.dlrm.fixture", "benchmarks.unet3d.fixture", "benchmarks.rnnt.fixture"]
WAIT_S = 60


def untouched(folder) -> dict:
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def foreign_folder(tmp_path):
    folder = tmp_path / "mine"
    folder.mkdir()
    (folder / "notes.txt").write_text("not a fixture")
    return folder


def one_file(tmp: os.PathLike) -> None:
    (tmp / "data.txt").write_text("fixture")


def test_written_once_reused_and_replaced_only_when_it_is_a_fixture(tmp_path):
    root = cached_fixture(tmp_path / "f", {"n": 1}, one_file)
    record = json.loads((root / MARKER).read_text())
    assert record == {"params": {"n": 1}} and (root / "data.txt").read_text() == "fixture"
    assert cached_fixture(root, {"n": 1}, lambda tmp: pytest.fail("rewrote it")) == root
    cached_fixture(root, {"n": 2}, lambda tmp: {"auc": 0.5})
    assert json.loads((root / MARKER).read_text()) == {"params": {"n": 2}, "auc": 0.5}
    assert not (root / "data.txt").exists()
    (tmp_path / "empty").mkdir()
    cached_fixture(tmp_path / "empty", {"n": 1}, one_file)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["empty", "f"]   # no partial copy


def test_a_folder_of_other_files_is_refused(tmp_path):
    folder = foreign_folder(tmp_path)
    with pytest.raises(UserError, match=f"^{folder} holds files and is no fixture of this "
                                        f"suite \\(no {MARKER}\\)"):
        cached_fixture(folder, {"n": 1}, lambda tmp: pytest.fail("wrote it"))
    assert untouched(folder) == {"notes.txt": b"not a fixture"}
    (tmp_path / "file").write_text("x")
    with pytest.raises(UserError, match="is not a folder"):
        cached_fixture(tmp_path / "file", {"n": 1}, one_file)


def test_a_link_to_a_folder_stays_a_link(tmp_path):
    """FIXTURE_DIR as a link to scratch space: refused as 'Cannot call rmtree on a symbolic
    link' when empty, and when it held an older fixture."""
    (tmp_path / "scratch").mkdir()
    link = tmp_path / "link"
    link.symlink_to(tmp_path / "scratch")
    for n in (1, 2):
        assert cached_fixture(link, {"n": n}, one_file) == link
        assert link.is_symlink() and (tmp_path / "scratch/data.txt").read_text() == "fixture"
        assert json.loads((link / MARKER).read_text()) == {"params": {"n": n}}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link", "scratch"]


@pytest.mark.parametrize("module", WRITERS)
def test_every_writer_refuses_a_folder_of_other_files_in_one_line(tmp_path, capsys, module):
    folder = foreign_folder(tmp_path)
    assert importlib.import_module(module).main([str(folder)]) == 2
    out, err = capsys.readouterr()
    (line,) = err.splitlines()
    assert line.startswith(f"error: {folder} holds files and is no fixture of this suite")
    assert untouched(folder) == {"notes.txt": b"not a fixture"}


def test_run_and_time_refuses_a_fixture_dir_of_other_files(tmp_path, monkeypatch):
    folder = foreign_folder(tmp_path)
    monkeypatch.delenv("DATADIR", raising=False)
    proc = run_script("resnet", {"FIXTURE_DIR": str(folder), "LOGDIR": str(tmp_path / "logs")},
                      timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = error_lines(proc)
    assert line.startswith(f"error: {folder} holds files and is no fixture of this suite")
    assert untouched(folder) == {"notes.txt": b"not a fixture"}


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_while_writing_leaves_nothing_and_says_so(tmp_path, signum):
    root = tmp_path / "imagenet"
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.resnet.fixture", str(root),
                             "--train-per-class", "5000"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + WAIT_S
        while not any(p.name.startswith(".imagenet.") and any(p.rglob("*.JPEG"))
                      for p in tmp_path.iterdir()):
            assert proc.poll() is None, "the writer ended before the signal"
            assert time.monotonic() < deadline, "no image written in time"
            time.sleep(0.1)
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=10)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signum
    assert stderr.splitlines() == [
        f"error: {signal.Signals(signum).name} while writing the fixture {root}: stopped and "
        f"the partial copy removed; run the writer again"]
    assert list(tmp_path.iterdir()) == []


def test_a_stop_in_a_callback_from_c_is_not_lost(tmp_path, capsys, monkeypatch):
    """espeak-ng hands the RNN-T writer its audio through a ctypes callback, which printed and
    dropped the exception of a stop whose handler ran there: the writer wrote on, exit 0."""
    from benchmarks.rnnt import fixture as rnnt

    as_array = np.ctypeslib.as_array

    def stop_once(*args, **kwargs):   # called in the callback, with the first chunk of audio
        monkeypatch.setattr(np.ctypeslib, "as_array", as_array)
        signal.raise_signal(signal.SIGTERM)
        return as_array(*args, **kwargs)

    monkeypatch.setattr(np.ctypeslib, "as_array", stop_once)
    root = tmp_path / "librispeech"
    assert rnnt.main([str(root), "--train", "8", "--eval", "4", "--train-speakers", "2",
                      "--eval-speakers", "1", "--vocab-size", "30"]) == 128 + signal.SIGTERM
    assert capsys.readouterr().err.splitlines() == [
        f"error: SIGTERM while writing the fixture {root}: stopped and the partial copy "
        f"removed; run the writer again"]
    assert list(tmp_path.iterdir()) == []
