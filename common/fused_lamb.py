"""LAMB's update in Triton kernels over the flat buffer (``fused-lamb``): the GPU counterpart
of :class:`common.lamb.ShardedLamb`, whose whole-buffer kernels stay the reference.

``ShardedLamb``'s update makes about a dozen passes over the fp32 shard: the moments, the
update ``u`` written whole, its norms and the weights', ``u`` scaled, the weights updated, the
model's copy written. Here the shard is cut into blocks that never cross a tensor's end. The
first kernel updates the moments and sums each block's ``|w|^2`` and ``|u|^2`` without storing
``u``; a small kernel adds the blocks' sums up to each piece's in a fixed order (the same sums
every run), which give each tensor's trust ratio; the last kernel recomputes ``u``, updates the
fp32 master and writes the model's copy. Division and square root round as torch's do
(``div_rn``, ``sqrt_rn``); the sums' order differs, so the result equals the reference within
fp32 rounding, not bit for bit (a GPU test)."""

from __future__ import annotations

import functools

import torch

from common.lamb import ShardedLamb

BLOCK = 2048   # elements a program; a block never crosses a tensor's end
CHUNK = 1024   # blocks' sums a piece's program adds at a time


@functools.cache
def _kernels():
    import triton
    import triton.language as tl

    @triton.jit
    def _update(m, v, w, wd, bc1, bc2, eps):
        return tl.math.div_rn(tl.math.div_rn(m, bc1),
                              tl.math.sqrt_rn(tl.math.div_rn(v, bc2)) + eps) + wd * w

    @triton.jit
    def moments_kernel(g_ptr, m_ptr, v_ptr, w_ptr, start_ptr, len_ptr, wd_ptr, clip_ptr,
                       bc1_ptr, bc2_ptr, partial_ptr, beta1, rest1, beta2, rest2, eps,
                       BLOCK: tl.constexpr):
        b = tl.program_id(0)
        lane = tl.arange(0, BLOCK)
        offs = tl.load(start_ptr + b) + lane
        mask = lane < tl.load(len_ptr + b)
        g = tl.load(g_ptr + offs, mask=mask, other=0.0).to(tl.float32) * tl.load(clip_ptr)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0) * beta1 + rest1 * g
        v = tl.load(v_ptr + offs, mask=mask, other=0.0) * beta2 + rest2 * g * g
        tl.store(m_ptr + offs, m, mask=mask)
        tl.store(v_ptr + offs, v, mask=mask)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        u = _update(m, v, w, tl.load(wd_ptr + b), tl.load(bc1_ptr), tl.load(bc2_ptr), eps)
        tl.store(partial_ptr + 2 * b, tl.sum(w * w, 0))
        tl.store(partial_ptr + 2 * b + 1, tl.sum(u * u, 0))

    @triton.jit
    def weights_kernel(m_ptr, v_ptr, w_ptr, copy_ptr, start_ptr, len_ptr, wd_ptr, scale_ptr,
                       bc1_ptr, bc2_ptr, eps, HAS_COPY: tl.constexpr, BLOCK: tl.constexpr):
        b = tl.program_id(0)
        lane = tl.arange(0, BLOCK)
        offs = tl.load(start_ptr + b) + lane
        mask = lane < tl.load(len_ptr + b)
        m = tl.load(m_ptr + offs, mask=mask, other=0.0)
        v = tl.load(v_ptr + offs, mask=mask, other=0.0)
        w = tl.load(w_ptr + offs, mask=mask, other=0.0)
        u = _update(m, v, w, tl.load(wd_ptr + b), tl.load(bc1_ptr), tl.load(bc2_ptr), eps)
        w = w - tl.load(scale_ptr + b) * u
        tl.store(w_ptr + offs, w, mask=mask)
        if HAS_COPY:
            tl.store(copy_ptr + offs, w.to(copy_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def pieces_kernel(partial_ptr, first_ptr, count_ptr, out_ptr, CHUNK: tl.constexpr):
        p = tl.program_id(0)
        first = tl.load(first_ptr + p)
        count = tl.load(count_ptr + p)
        w2 = tl.zeros([CHUNK], tl.float32)
        u2 = tl.zeros([CHUNK], tl.float32)
        for i in range(0, count, CHUNK):
            lane = i + tl.arange(0, CHUNK)
            at = (first + lane) * 2
            w2 += tl.load(partial_ptr + at, mask=lane < count, other=0.0)
            u2 += tl.load(partial_ptr + at + 1, mask=lane < count, other=0.0)
        tl.store(out_ptr + 2 * p, tl.sum(w2, 0))
        tl.store(out_ptr + 2 * p + 1, tl.sum(u2, 0))

    return moments_kernel, weights_kernel, pieces_kernel


class FusedLamb(ShardedLamb):
    """:class:`ShardedLamb` (the same arguments, state and collectives) with its update in
    Triton kernels; CUDA only."""

    def _prepare_update(self) -> None:
        """The blocks (start, length, tensor, weight decay) and the pieces' blocks, in place of
        the reference's per-element weight decay."""
        if self.m.device.type != "cuda":
            raise ValueError("fused-lamb runs on CUDA devices only")
        starts, lengths, owners, offset = [], [], [], 0
        for length, owner in zip(self.lengths, self.owner.tolist()):
            first = torch.arange(offset, offset + length, BLOCK)
            starts.append(first)
            lengths.append((offset + length - first).clamp(max=BLOCK))
            owners.append(torch.full_like(first, owner))
            offset += length
        dev = self.m.device
        self.block_start = torch.cat(starts).to(dev)
        self.block_len = torch.cat(lengths).to(dev, torch.int32)
        self.block_owner = torch.cat(owners).to(dev)
        counts = torch.tensor([len(s) for s in starts])
        self.piece_count = counts.to(dev)
        self.piece_first = (counts.cumsum(0) - counts).to(dev)
        self.piece_sums = torch.empty(len(counts), 2, device=dev)
        self.block_wd = self.decay[self.block_owner].float() * self.h.weight_decay
        self.partial = torch.empty(len(self.block_start), 2, device=dev)

    def _update(self, g: torch.Tensor, w: torch.Tensor, clip: torch.Tensor,
                lr: torch.Tensor) -> None:
        h = self.h
        bc1, bc2 = 1 - h.beta1 ** self.t, 1 - h.beta2 ** self.t
        moments, weights, pieces = _kernels()
        grid = (len(self.block_start),)
        moments[grid](g, self.m, self.v, w, self.block_start, self.block_len, self.block_wd,
                      clip, bc1, bc2, self.partial, h.beta1, 1 - h.beta1, h.beta2, 1 - h.beta2,
                      h.eps, BLOCK=BLOCK, num_warps=4)
        pieces[(len(self.piece_count),)](self.partial, self.piece_first, self.piece_count,
                                         self.piece_sums, CHUNK=CHUNK, num_warps=4)
        scale = (self._trust_ratios(self.piece_sums) * lr)[self.block_owner]
        copy = self.flat.shard(self.flat.data, self.rank)
        has_copy = self.flat.data is not self.flat.master
        weights[grid](self.m, self.v, w, copy if has_copy else w, self.block_start,
                      self.block_len, self.block_wd, scale, bc1, bc2, h.eps,
                      HAS_COPY=has_copy, BLOCK=BLOCK, num_warps=4)
