"""How many variants of a ``@triton.jit`` kernel are compiled so far, for the GPU tests that
check a kernel is not recompiled when a batch brings new sizes."""


def compiled_variants(kernel) -> int:
    """Compiled variants of ``kernel`` on every device (Triton 3.2+ keeps them in
    ``device_caches``, earlier versions in ``cache``)."""
    caches = getattr(kernel, "device_caches", None)
    if caches is not None:
        return sum(len(entry[0]) for entry in caches.values())
    return sum(len(cache) for cache in kernel.cache.values())
