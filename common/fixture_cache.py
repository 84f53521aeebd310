"""Fixtures written once: the folder appears complete or not at all (written beside it, then
renamed), and is reused while the parameters its ``FIXTURE_COMPLETE`` marker records match."""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

MARKER = "FIXTURE_COMPLETE"


def cached_fixture(root, params: dict, write: Callable[[Path], None]) -> Path:
    """``root`` as it is when its marker records ``params``; otherwise ``write(folder)`` fills
    a fresh folder that then replaces ``root``."""
    root = Path(root)
    marker = root / MARKER
    if marker.is_file() and json.loads(marker.read_text()) == params:
        return root
    root.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{root.name}.", dir=root.parent))
    try:
        write(tmp)
        (tmp / MARKER).write_text(json.dumps(params))
        if root.exists():
            shutil.rmtree(root)
        tmp.rename(root)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return root
