"""``triton-attention``'s Triton kernels: flash attention over packed sequences with the
attention dropout drawn inside them. Imported on first use, so that the CPU tests need no
Triton.

Layout: ``q, k, v`` rows are tokens (``stride`` elements apart), a head's ``D`` values at
``head * D``; sequence ``i`` is tokens ``offsets[i]:offsets[i + 1]``, none longer than ``S``.
The softmax runs in base 2 (``qk_scale`` folds ``log2 e`` into the softmax scale) and ``lse``
[heads, tokens] holds each row's base-2 log-sum-exp for the backward.

Dropout: the entry of head ``h``, query token ``t`` (packed) and key ``j`` (within its
sequence) is kept where 16 bits of a hash of the index ``(h * tokens + t) * S + j // 16 * 8 +
j % 8`` and the call's seed reach ``threshold`` (``p * 2**16``): the low half for ``j % 16 <
8``, the high half for the others, so one hash serves keys ``j`` and ``j + 8``, which a
thread's tensor-core tile holds in either orientation. The draw is a function of the entry
alone, so the backward's kernels redraw the forward's mask with tiles of their own (key
blocks of a multiple of 16) and in either orientation. The hash is ``lowbias32``
(multiply-xorshift rounds, a bijection of 32-bit words with full avalanche) of the index times
the golden ratio plus the seed: a Philox call (ten rounds) an entry cost the forward twice its
time, and one Philox call spread over eight entries needs a shuffle of the tile that cost as
much.
"""

import triton
import triton.language as tl

from benchmarks.bert.kernels import _mix


@triton.jit
def _keep(seed, tok, n0, head, T, S, threshold, BN: tl.constexpr, KEYS_FIRST: tl.constexpr):
    """[rows, BN] (``KEYS_FIRST``: [BN, rows]) keep flags of query tokens ``tok`` and keys
    ``n0 ... n0 + BN - 1`` (n0 and BN multiples of 16). One hash serves keys k and k + 8 of a
    16-aligned block: its low and high 16 bits."""
    R: tl.constexpr = tok.shape[0]
    pair = (n0 // 2 + tl.arange(0, BN // 2)).to(tl.uint32) * 0x9E3779B9
    row = ((head * T + tok) * S).to(tl.uint32) * 0x9E3779B9 + seed
    if KEYS_FIRST:
        x = pair[:, None] + row[None, :]
    else:
        x = row[:, None] + pair[None, :]
    x = _mix(x)
    x ^= x >> 16   # lowbias32's last xorshift: the low half mixed too
    d = tl.join(x & 0xFFFF, x >> 16)
    if KEYS_FIRST:   # [BN/2, R, 2] -> [BN/16, 2, 8, R]
        d = tl.permute(tl.reshape(d, [BN // 16, 8, R, 2]), (0, 3, 1, 2))
        d = tl.reshape(d, [BN, R])
    else:            # [R, BN/2, 2] -> [R, BN/16, 2, 8]
        d = tl.permute(tl.reshape(d, [R, BN // 16, 8, 2]), (0, 1, 3, 2))
        d = tl.reshape(d, [R, BN])
    return d >= threshold.to(tl.uint32)


@triton.jit
def _rows(ptr, tok, stride, head, ok, D: tl.constexpr):
    at = tok[:, None].to(tl.int64) * stride + head * D + tl.arange(0, D)[None, :]
    return tl.load(ptr + at, mask=ok[:, None], other=0.0)


@triton.jit
def _store_rows(ptr, x, tok, stride, head, ok, D: tl.constexpr):
    at = tok[:, None].to(tl.int64) * stride + head * D + tl.arange(0, D)[None, :]
    tl.store(ptr + at, x.to(ptr.dtype.element_ty), mask=ok[:, None])


@triton.jit
def _sequence(offsets_ptr):
    seq = tl.program_id(1)
    start = tl.load(offsets_ptr + seq)
    return start, tl.load(offsets_ptr + seq + 1) - start


@triton.jit
def _span(start, L, first, B: tl.constexpr):
    """Positions ``first ... first + B - 1`` of a sequence of ``L`` tokens from token
    ``start``: the positions, which of them lie in it, their tokens."""
    pos = first + tl.arange(0, B)
    return pos, pos < L, start + pos


@triton.jit
def _keys_values(k_ptr, v_ptr, tok, sk, sv, head, ok, D: tl.constexpr):
    return _rows(k_ptr, tok, sk, head, ok, D), _rows(v_ptr, tok, sv, head, ok, D)


@triton.jit
def attention_forward_kernel(q_ptr, k_ptr, v_ptr, o_ptr, lse_ptr, offsets_ptr, seed_ptr,
                             sq, sk, sv, so, T, S, threshold, inv_keep, qk_scale,
                             D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                             DROPOUT: tl.constexpr):
    """Output rows ``BM * program_id(0) ...`` of sequence ``program_id(1)``, head
    ``program_id(2)``: ``softmax(q k^T * scale)``, dropped out, times ``v``."""
    m0 = tl.program_id(0) * BM
    head = tl.program_id(2)
    start, L = _sequence(offsets_ptr)
    if m0 >= L:
        return
    rows, ok, tok = _span(start, L, m0, BM)
    q = _rows(q_ptr, tok, sq, head, ok, D)
    m = tl.full([BM], float("-inf"), tl.float32)
    l = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    seed = tl.load(seed_ptr).to(tl.uint32) if DROPOUT else 0
    for n0 in range(0, L, BN):
        _, cok, keys = _span(start, L, n0, BN)
        k, v = _keys_values(k_ptr, v_ptr, keys, sk, sv, head, cok, D)
        s = tl.where(cok[None, :], tl.dot(q, tl.trans(k)) * qk_scale, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.math.exp2(m - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        if DROPOUT:
            p = tl.where(_keep(seed, tok, n0, head, T, S, threshold, BN, False), p, 0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    _store_rows(o_ptr, acc * (inv_keep / l)[:, None], tok, so, head, ok, D)
    tl.store(lse_ptr + head * T + tok, m + tl.math.log2(l), mask=ok)


@triton.jit
def attention_dkdv_kernel(q_ptr, k_ptr, v_ptr, do_ptr, dk_ptr, dv_ptr, lse_ptr, delta_ptr,
                          offsets_ptr, seed_ptr, sq, sk, sv, sdo, sdk, sdv, T, S, threshold,
                          inv_keep, qk_scale, sm_scale, D: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, DROPOUT: tl.constexpr):
    """The key and value gradients of keys ``BN * program_id(0) ...`` of sequence
    ``program_id(1)``, head ``program_id(2)``, over transposed [keys, rows] tiles. Rows and
    keys past the sequence load as zeros, which add nothing to the kept gradients."""
    n0 = tl.program_id(0) * BN
    head = tl.program_id(2)
    start, L = _sequence(offsets_ptr)
    if n0 >= L:
        return
    _, cok, keys = _span(start, L, n0, BN)
    k, v = _keys_values(k_ptr, v_ptr, keys, sk, sv, head, cok, D)
    dk = tl.zeros([BN, D], tl.float32)
    dv = tl.zeros([BN, D], tl.float32)
    seed = tl.load(seed_ptr).to(tl.uint32) if DROPOUT else 0
    for m0 in range(0, L, BM):
        rows, ok, tok = _span(start, L, m0, BM)
        q = _rows(q_ptr, tok, sq, head, ok, D)
        do = _rows(do_ptr, tok, sdo, head, ok, D)
        lse = tl.load(lse_ptr + head * T + tok, mask=ok, other=0.0)
        delta = tl.load(delta_ptr + head * T + tok, mask=ok, other=0.0)
        pt = tl.math.exp2(tl.dot(k, tl.trans(q)) * qk_scale - lse[None, :])
        dpt = tl.dot(v, tl.trans(do))
        kept = pt
        if DROPOUT:
            keep = _keep(seed, tok, n0, head, T, S, threshold, BN, True)
            kept = tl.where(keep, pt, 0.0)
            dpt = tl.where(keep, dpt * inv_keep, 0.0)
        dv += tl.dot(kept.to(do.dtype), do)
        dk += tl.dot((pt * (dpt - delta[None, :])).to(q.dtype), q)
    _store_rows(dk_ptr, dk * sm_scale, keys, sdk, head, cok, D)
    _store_rows(dv_ptr, dv * inv_keep, keys, sdv, head, cok, D)


@triton.jit
def attention_dq_kernel(q_ptr, k_ptr, v_ptr, o_ptr, do_ptr, dq_ptr, lse_ptr, delta_ptr,
                        offsets_ptr, seed_ptr, sq, sk, sv, so, sdo, sdq, T, S, threshold,
                        inv_keep, qk_scale, sm_scale, D: tl.constexpr, BM: tl.constexpr,
                        BN: tl.constexpr, DROPOUT: tl.constexpr):
    """The query gradients of rows ``BM * program_id(0) ...`` of sequence ``program_id(1)``,
    head ``program_id(2)``, and their ``delta = sum(dO * O)`` over the head's values, which
    it stores for the key and value gradients' kernel."""
    m0 = tl.program_id(0) * BM
    head = tl.program_id(2)
    start, L = _sequence(offsets_ptr)
    if m0 >= L:
        return
    rows, ok, tok = _span(start, L, m0, BM)
    q = _rows(q_ptr, tok, sq, head, ok, D)
    do = _rows(do_ptr, tok, sdo, head, ok, D)
    delta = tl.sum(_rows(o_ptr, tok, so, head, ok, D).to(tl.float32) * do.to(tl.float32), 1)
    tl.store(delta_ptr + head * T + tok, delta, mask=ok)
    lse = tl.load(lse_ptr + head * T + tok, mask=ok, other=0.0)
    dq = tl.zeros([BM, D], tl.float32)
    seed = tl.load(seed_ptr).to(tl.uint32) if DROPOUT else 0
    for n0 in range(0, L, BN):
        _, cok, keys = _span(start, L, n0, BN)
        k, v = _keys_values(k_ptr, v_ptr, keys, sk, sv, head, cok, D)
        # keys past the sequence: zeros, but their probabilities are not (exp2(-lse))
        p = tl.where(cok[None, :], tl.math.exp2(tl.dot(q, tl.trans(k)) * qk_scale
                                                - lse[:, None]), 0.0)
        dp = tl.dot(do, tl.trans(v))
        if DROPOUT:
            keep = _keep(seed, tok, n0, head, T, S, threshold, BN, False)
            dp = tl.where(keep, dp * inv_keep, 0.0)
        dq += tl.dot((p * (dp - delta[:, None])).to(k.dtype), k)
    _store_rows(dq_ptr, dq * sm_scale, tok, sdq, head, ok, D)
