"""The ``region-decode`` optimisation (over ``turbo``): decoding only a crop's region of a JPEG:
libjpeg-turbo 3's TurboJPEG API (``tj3SetCroppingRegion``), called through ``ctypes``.

Whole-image decoding spends most of a loader process's time on pixels the random-resized
crop throws away. With a cropping region, libjpeg-turbo stops reading at the crop's last
row, skips the rows above it without the inverse DCT and colour conversion, and runs both
only over the crop's columns. Those are widened left to an MCU boundary (the API's
rule) and by one MCU on each side where needed, so that the chroma upsampling at the
crop's edges sees the same neighbours as in a whole decode: the pixels equal the whole
decode's bit for bit.

No Python wheel exposes this API (``simplejpeg`` and Pillow link libjpeg-turbo privately),
so the library is built from the libjpeg-turbo 3 sources that ``simplejpeg``'s sdist carries:
``make turbojpeg`` puts ``libturbojpeg.so.0`` into the virtual environment's ``lib``.
``$TURBOJPEG_LIB`` names another copy. Files this decoder rejects (not a JPEG, truncated,
CMYK) return ``None``: the caller decodes them as before and names the files it cannot.
"""

from __future__ import annotations

import ctypes
import os
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np

from common.errors import UserError

LIB_ENV = "TURBOJPEG_LIB"
_INIT_DECOMPRESS = 1
_SUBSAMP, _WIDTH, _HEIGHT, _COLORSPACE = 4, 5, 6, 8   # TJPARAM_*
_PF_RGB = 0
_CS_RGB_CONVERTIBLE = (0, 1, 2)   # TJCS_RGB, TJCS_YCbCr, TJCS_GRAY
_MCU_WIDTH = (8, 16, 16, 8, 8, 32, 8)   # tjMCUWidth by TJSAMP_*


class Region(NamedTuple):
    """What decoding a crop's box writes: ``rows`` x ``columns`` pixels from column ``x``
    and row ``top`` of the image; the box is columns ``skip`` to ``skip + width`` of them."""
    x: int
    top: int
    columns: int
    rows: int
    skip: int
    width: int
    flip: bool


class _Region(ctypes.Structure):
    _fields_ = [("x", ctypes.c_int), ("y", ctypes.c_int), ("w", ctypes.c_int),
                ("h", ctypes.c_int)]


def library_path() -> Path:
    """``$TURBOJPEG_LIB``, else the virtual environment's ``lib/libturbojpeg.so.0``."""
    return Path(os.environ.get(LIB_ENV) or Path(sys.prefix) / "lib" / "libturbojpeg.so.0")


def _load(path: Path) -> ctypes.CDLL:
    fix = f"run `make turbojpeg` or set {LIB_ENV}, or drop the optimisation region-decode"
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as exc:
        raise UserError(f"{path}: cannot load libturbojpeg ({exc}); {fix}") from None
    if not hasattr(lib, "tj3SetCroppingRegion"):
        raise UserError(f"{path}: libturbojpeg older than 3.0 (no tj3SetCroppingRegion); {fix}")
    lib.tj3Init.restype = ctypes.c_void_p
    lib.tj3Init.argtypes = [ctypes.c_int]
    lib.tj3DecompressHeader.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.tj3Get.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.tj3SetCroppingRegion.argtypes = [ctypes.c_void_p, _Region]
    lib.tj3Decompress8.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t,
                                   ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
    return lib


class RegionDecoder:
    """One TurboJPEG decompressor. Pickled without it (loader processes open their own)."""

    def __init__(self, path: Path | None = None):
        self.path = Path(path) if path else library_path()
        self._lib, self._handle = None, None
        self._open()   # fail here, in the main process, not in a loader process

    def _open(self) -> None:
        self._lib = _load(self.path)
        self._handle = self._lib.tj3Init(_INIT_DECOMPRESS)
        if not self._handle:
            raise UserError(f"{self.path}: tj3Init failed; drop the optimisation region-decode")

    def __getstate__(self):
        return {"path": self.path}

    def __setstate__(self, state):
        self.path, self._lib, self._handle = state["path"], None, None

    def crop(self, blob: bytes, plan) -> tuple[np.ndarray, bool] | None:
        """``(pixels, flip)``: uint8 [h, w, 3] RGB of the box that ``plan(width, height) ->
        ((left, top, w, h), flip)`` gives for this JPEG, decoded alone; ``None`` for a file
        this decoder declines (not a JPEG, damaged, CMYK or YCCK: libjpeg-turbo reports an
        error or a warning, or cannot convert it to RGB)."""
        region = self.locate(blob, plan)
        if region is None:
            return None
        out = np.empty((region.rows, region.columns, 3), dtype=np.uint8)
        if not self.decode(blob, region, out):
            return None
        return out[:, region.skip:region.skip + region.width], region.flip

    def locate(self, blob: bytes, plan) -> Region | None:
        """The rows and columns that decoding ``plan``'s box of this JPEG writes (the box
        widened to MCU columns); ``None`` where ``crop`` would decline the file."""
        if self._handle is None:
            self._open()
        lib, h = self._lib, self._handle
        if (lib.tj3DecompressHeader(h, blob, len(blob))
                or lib.tj3Get(h, _COLORSPACE) not in _CS_RGB_CONVERTIBLE):
            return None
        width = lib.tj3Get(h, _WIDTH)
        (left, top, w, hh), flip = plan(width, lib.tj3Get(h, _HEIGHT))
        subsamp = lib.tj3Get(h, _SUBSAMP)
        mcu = _MCU_WIDTH[subsamp] if 0 <= subsamp < len(_MCU_WIDTH) else 0
        x0 = left - left % mcu if mcu else 0
        if mcu and x0 == left > 0:   # the crop's first column needs the chroma on its left
            x0 -= mcu
        x1 = min(width, left + w + mcu) if mcu else width
        return Region(x0, top, x1 - x0, hh, left - x0, w, flip)

    def decode(self, blob: bytes, region: Region, out: np.ndarray) -> bool:
        """Decode ``region`` (from ``locate`` on this ``blob``, just before) into ``out``, a
        C-contiguous uint8 [rows, columns, 3] array; False where libjpeg-turbo fails."""
        lib, h = self._lib, self._handle
        if lib.tj3SetCroppingRegion(h, _Region(region.x, region.top, region.columns,
                                               region.rows)):
            return False
        return not lib.tj3Decompress8(h, blob, len(blob), out.ctypes.data, 0, _PF_RGB)


def select(wl, _) -> None:
    RegionDecoder()   # a missing or old library: one line now, before anything is built
    wl.impl.options["region_decode"] = True
