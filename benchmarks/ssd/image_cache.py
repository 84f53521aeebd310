"""A cache of decoded training images for SSD (optimisation ``image-cache=device|host``).

NVIDIA's MLPerf Training v1.1 SSD decoded each COCO image once, kept it in GPU memory and ran
the crop, flip, resize and colour jitter there, instead of decoding a JPEG per sample per
epoch. ``ImageCache`` holds every training image as uint8 in one padded [N, 3, S, S] tensor
on the device (S = ``max_side``; an image whose longer side exceeds S is shrunk to it,
antialiased, aspect kept), filled on first use, not at construction: MLPerf times reading
the data. The CPU pipeline (``data.py``) stays the reference: each sample's random choices
come from the same ``TrainDataset.plan`` (computed by ``PlanDataset`` in the loader's
workers), so boxes, labels and validity masks are identical; the pixels of a whole batch go
through one ``grid_sample`` (crop, flip and resize to 300x300 at once) and the same batched
colour jitter (``data.apply_color_jitter``), then normalisation.

Deviation: the resize is bilinear without antialiasing, so where a crop is wider or taller
than 300 cached pixels the output aliases where the CPU path's antialiased resize does not;
with no such crop (cached side <= 300) the two agree to float rounding (measured: at most
4e-6 on the 128-pixel COCO fixture). On the fixture at image size 640 (crops of 144 to 640
pixels; 2 epochs, 64 samples) the mean absolute difference from the CPU path is 0.0038 at
``max_side`` 640 and 0.0026 at 384, whose antialiased shrink removes part of the aliasing
(pixel values 0..1, before normalisation).
Every rank caches every image (its batches come from the whole shuffled epoch): COCO's
117266 images take 117266 x 3 x S^2 bytes per device, 51.9 GB at S = 384. Where that does
not fit beside the step (one H100 at batch 1024), ``storage="host"`` (``image-cache=host``)
keeps the cache in host memory, page-locked and mapped into the GPU's address space once
filled (``cudaHostRegister``): the GPU gathers a batch's images straight from host memory
over PCIe, then runs the same crop, flip, resize and jitter. Gathering on the host and
copying from pageable memory instead held the host about 20x longer, the GPU idle for the
copy (figures in docs/performance.md#ssd).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.ssd import data
from common import loaders
from common.coco.data import Epoch, ImageRecord, decode_image_chw
from common.errors import UserError

MAX_SIDE = 384     # --cache-side default
STORAGES = ("device", "host")
FILL_CHUNK = 32    # images per decoded, pinned chunk copied to the device


def cached_size(height: int, width: int, max_side: int) -> tuple[int, int]:
    """(height, width) of an image in the cache: its longer side at most ``max_side``."""
    scale = min(1.0, max_side / max(height, width))
    return max(1, round(height * scale)), max(1, round(width * scale))


def downscale(image: torch.Tensor, max_side: int) -> torch.Tensor:
    """uint8 [3, H, W] shrunk to :func:`cached_size` (bilinear, antialiased); never enlarged."""
    size = cached_size(*image.shape[-2:], max_side)
    if size == tuple(image.shape[-2:]):
        return image
    x = F.interpolate(image[None].float(), size, mode="bilinear", align_corners=False,
                      antialias=True)
    return x[0].round_().clamp_(0, 255).to(torch.uint8)


def crop_flip_resize(images: torch.Tensor, windows: torch.Tensor, flips: torch.Tensor,
                     size: int = data.IMAGE_SIZE) -> torch.Tensor:
    """Pixels 0..255 [B, 3, H, W] (any dtype), pixel windows ltrb [B, 4] and flips [B] bool
    (both on the CPU) -> float [B, 3, size, size] in 0..1: each image's window, mirrored
    where flipped, resized bilinearly, by one ``grid_sample``. Sampling points are clamped
    to the window's outer pixel centres, so its edges repeat as ``F.interpolate``'s do and
    nothing outside it (other pixels, padding) is read."""
    extent = torch.tensor(images.shape[:-3:-1], dtype=torch.float64)   # (W, H)
    lt, rb = windows[:, :2].double(), windows[:, 2:].double()
    scale = (rb - lt) / extent
    scale[:, 0] = torch.where(flips, -scale[:, 0], scale[:, 0])
    # output pixel centres o in (-1, 1) -> window pixels, in grid_sample's coordinates
    theta = torch.cat((torch.diag_embed(scale), ((lt + rb) / extent - 1)[:, :, None]), 2)
    lo, hi = (2 * lt + 1) / extent - 1, (2 * rb - 1) / extent - 1

    def move(t):
        return t.float().to(images.device, non_blocking=True)

    grid = F.affine_grid(move(theta), [len(images), 3, size, size], align_corners=False)
    grid = torch.minimum(torch.maximum(grid, move(lo)[:, None, None]), move(hi)[:, None, None])
    x = F.grid_sample(images.float(), grid, mode="bilinear", padding_mode="border",
                      align_corners=False)
    return x.div_(255)


class _Decoded(torch.utils.data.Dataset):
    """Decoded, downscaled images, zero-padded to [3, max_side, max_side]."""

    def __init__(self, records: list[ImageRecord], max_side: int):
        self.records, self.max_side = records, max_side

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        r = self.records[i]
        image = downscale(decode_image_chw(r.path, (r.width, r.height)), self.max_side)
        out = image.new_zeros(3, self.max_side, self.max_side)
        out[:, :image.shape[1], :image.shape[2]] = image
        return out


class ImageCache:
    """Every image of ``records``: uint8 [N, 3, max_side, max_side] (``images``, decoded by
    ``num_workers`` processes on first use), each in its top-left ``sizes[i]`` = (height,
    width) corner, held on ``device`` (``storage`` "device") or in host memory ("host");
    batches are augmented on ``device`` either way, their colour jitter by ``jitter``
    (``data.apply_color_jitter``'s contract)."""

    def __init__(self, records: list[ImageRecord], device: torch.device | str,
                 max_side: int = MAX_SIDE, num_workers: int = 0, storage: str = "device"):
        if max_side < 1:
            raise UserError(f"--cache-side {max_side}: must be at least 1 pixel")
        if storage not in STORAGES:
            raise ValueError(f"storage must be one of {STORAGES}, not {storage!r}")
        self.records, self.device = records, torch.device(device)
        self.holder = self.device if storage == "device" else torch.device("cpu")
        self.max_side, self.num_workers = max_side, num_workers
        self.jitter = data.apply_color_jitter
        self.sizes = torch.tensor([cached_size(r.height, r.width, max_side)
                                   for r in records], dtype=torch.int64).view(-1, 2)
        original = torch.tensor([(r.width, r.height) for r in records],
                                dtype=torch.float64).view(-1, 2)
        self.scales = self.sizes.flip(1) / original   # (x, y): cached pixels per original one
        self._images = self._host = None

    def __len__(self) -> int:
        return len(self.sizes)

    @property
    def nbytes(self) -> int:
        return len(self) * 3 * self.max_side ** 2

    @property
    def filled(self) -> bool:
        return self._images is not None

    @property
    def images(self) -> torch.Tensor:
        if self._images is None:
            self.fill()
        return self._images

    def fill(self) -> None:
        """Decode every image (CPU workers) into the cache (to the device in pinned chunks)."""
        side = self.max_side
        try:
            images = torch.empty(len(self), 3, side, side, dtype=torch.uint8, device=self.holder)
        except (torch.cuda.OutOfMemoryError, RuntimeError):
            raise UserError(f"the image cache ({self.nbytes / 1e9:.1f} GB: {len(self)} images "
                            f"of up to {side}x{side}) does not fit in {self.holder} memory; "
                            "lower --cache-side, use image-cache=host or drop image-cache"
                            ) from None
        loader = torch.utils.data.DataLoader(
            _Decoded(self.records, side), batch_size=FILL_CHUNK, num_workers=self.num_workers,
            pin_memory=self.holder.type == "cuda", worker_init_fn=loaders.quiet_on_stop)
        start = 0
        for chunk in loader:
            images[start:start + len(chunk)].copy_(chunk, non_blocking=True)
            start += len(chunk)
        if self.holder != self.device and self.device.type == "cuda":
            self._host, images = images, _mapped(images, self.device)
        self._images = images

    def close(self) -> None:
        """Unmap and unlock a host cache (the cache is filled again if used again)."""
        if self._host is not None:
            torch.cuda.synchronize(self.device)
            loaders.unlock(self._host)
        self._images = self._host = None

    def augment(self, index: torch.Tensor, windows: torch.Tensor, flips: torch.Tensor,
                factors: torch.Tensor, order: torch.Tensor, size: int = data.IMAGE_SIZE
                ) -> torch.Tensor:
        """Normalised training images [B, 3, size, size] on the device from cached images
        ``index`` [B]: windows [B, 4] in original pixels, flips, jitter factors and order
        (all on the CPU; ``data.Augmentation``)."""
        images = self.images.index_select(0, index.to(self.images.device, non_blocking=True))
        x = crop_flip_resize(images, windows * self.scales[index].repeat(1, 2), flips, size)
        return data.normalize(self.jitter(x, factors, order))


class _CudaArray:
    """``__cuda_array_interface__`` of uint8 memory at a device address (for ``as_tensor``)."""

    def __init__(self, pointer: int, shape: tuple):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": "|u1", "version": 3,
                                         "data": (pointer, False), "strides": None}


def _mapped(host: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A tensor on ``device`` over ``host``'s memory (uint8, contiguous), page-locked and
    mapped for the GPU (unified addressing: the same address); kernels that read it read host
    memory over PCIe. The caller keeps ``host`` alive and unregisters it."""
    loaders.page_lock(host, "the host image cache", "free host memory (or raise the "
                      "locked-memory limit, ulimit -l), lower --cache-side or drop image-cache")
    with torch.cuda.device(device):
        return torch.as_tensor(_CudaArray(host.data_ptr(), tuple(host.shape)), device=device)


class PlanDataset(data.TrainDataset):
    """A ``TrainDataset``'s samples without pixels: (index, crop window ltrb [4] in original
    pixels (the whole image when not cropped), flip, jitter factors [4], order [4], boxes,
    labels, valid)."""

    def __init__(self, samples: data.TrainDataset):
        vars(self).update(vars(samples))

    def __getitem__(self, i):
        r = self.records[i]
        a, targets = self.plan(i)
        window = a.crop or (0, 0, r.width, r.height)
        return (torch.tensor(i), torch.tensor(window, dtype=torch.float64), torch.tensor(a.flip),
                torch.tensor(a.factors), torch.tensor(a.order), *targets)


class CachedLoader:
    """``Loader``'s training interface over an ``ImageCache``: plan batches from a CPU
    ``Loader`` over a ``PlanDataset`` (its workers run ahead), pixels from the cache."""

    def __init__(self, cache: ImageCache, plans: data.Loader):
        self.cache, self.plans = cache, plans

    def batches(self, epoch: int) -> list[list[int]]:
        return self.plans.batches(epoch)

    def __len__(self) -> int:
        return len(self.plans)

    def epoch(self, epoch: int) -> Epoch:
        return Epoch(self, epoch)

    def close(self) -> None:
        self.plans.close()
        self.cache.close()

    def iterate(self, epoch: int):
        size = self.plans.dataset.size
        for index, windows, flips, factors, order, *targets in self.plans.iterate(epoch):
            images = self.cache.augment(index, windows, flips, factors, order, size)
            yield images, *(t.to(self.cache.device, non_blocking=True) for t in targets)


def cached(loader: data.Loader, storage: str = "device", max_side: int = MAX_SIDE
           ) -> CachedLoader:
    """The training ``loader``'s batches (the same samples, plans and targets) with the pixels
    from a cache of its images in ``storage``, filled on the first batch; its workers decode
    the cache and compute the plans."""
    samples = loader.dataset
    plans = data.Loader(PlanDataset(samples), True, loader.batch_size, loader.rank,
                        loader.world_size, loader.seed, loader.num_workers)
    return CachedLoader(ImageCache(samples.records, loader.device, max_side, loader.num_workers,
                                   storage), plans)
