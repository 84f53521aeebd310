"""The ``dali`` input optimisation: NVIDIA DALI reads, decodes (on the GPU: ``mixed``),
crops, resizes and normalises the batches in place of the Pillow reader (``data.py``). Its
crops and flips come from DALI's generators, not ``data.crop_plan``."""

from __future__ import annotations

from benchmarks.resnet.data import EVAL_CROP_FRACTION, MEAN, STD
from common.errors import UserError


def select(wl, _) -> None:
    try:
        import nvidia.dali  # noqa: F401  an optional extra
    except ImportError:
        raise UserError("optimisation dali needs NVIDIA DALI: pip install -e '.[dali]'") from None
    wl.impl.decoder = decoder


def decoder(samples, size, train, seed, batch_size, workers, device):
    """``data.Loader``'s decode function: one DALI pipeline per pass."""
    from nvidia.dali import fn, pipeline_def, types
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator
    on_gpu = device.type == "cuda"

    def decode(indices, epoch):
        files = [samples[i][0] for i in indices]
        labels = [samples[i][1] for i in indices]

        @pipeline_def(batch_size=batch_size, num_threads=max(workers, 1),
                      device_id=device.index if on_gpu else None, seed=seed + epoch)
        def pipe():
            jpegs, lab = fn.readers.file(files=files, labels=labels, random_shuffle=False,
                                         name="reader")
            dev = "mixed" if on_gpu else "cpu"
            if train:
                imgs = fn.decoders.image_random_crop(jpegs, device=dev, output_type=types.RGB,
                                                     random_area=[0.08, 1.0],
                                                     random_aspect_ratio=[0.75, 4 / 3])
                imgs = fn.resize(imgs, resize_x=size, resize_y=size)
                mirror = fn.random.coin_flip(probability=0.5)
            else:
                imgs = fn.decoders.image(jpegs, device=dev, output_type=types.RGB)
                imgs = fn.resize(imgs, resize_shorter=round(size / EVAL_CROP_FRACTION))
                mirror = 0
            imgs = fn.crop_mirror_normalize(imgs, crop=(size, size), mean=list(MEAN),
                                            std=list(STD), mirror=mirror, output_layout="CHW",
                                            dtype=types.FLOAT)
            return imgs, lab

        p = pipe()
        p.build()
        n = len(files) // batch_size * batch_size if train else len(files)
        policy = LastBatchPolicy.DROP if train else LastBatchPolicy.PARTIAL
        it = DALIGenericIterator(p, ["images", "labels"], size=n, auto_reset=False,
                                 last_batch_padded=False, last_batch_policy=policy)
        for out in it:
            yield out[0]["images"].to(device), out[0]["labels"].view(-1).long().to(device)
    return decode
