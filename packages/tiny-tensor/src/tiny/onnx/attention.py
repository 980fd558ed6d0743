"""ONNX's Attention operator (opsets 23 to 25) as tiny tensor ops: multi-head, grouped-query and multi-query
attention over 3-d or 4-d inputs, with a boolean or additive mask, causal masking aligned to the key cache's end,
sliding windows, a past key/value cache or the keys' non-padded lengths, soft capping, and the optional
scores output."""

from __future__ import annotations

import math

from tiny.ir.dtypes import dtypes
from tiny.onnx.model import NodeCall, onnx_dtype, register
from tiny.tensor import Tensor


def _heads(t: Tensor, n_heads: int) -> Tensor:
    """(batch, seq, heads * size) -> (batch, heads, seq, size)."""
    b, s, hidden = t.shape
    return t.reshape(b, s, n_heads, hidden // n_heads).transpose(1, 2)


def _allowed(c: NodeCall, sq: int, skv: int, offset: Tensor) -> Tensor | None:
    """Where query i may see key j by position (causal frontier and sliding window, both aligned to
    `offset`, the count of keys before the query block: (batch, 1, 1, 1)); None when every key may be seen."""
    i = Tensor.arange(sq, device=c.device).reshape(1, 1, sq, 1)
    j = Tensor.arange(skv, device=c.device).reshape(1, 1, 1, skv)
    diff = i + offset - j  # how far key j lies behind query i's absolute position
    allowed = None
    left, right = c.attr("left_window_size", -1), c.attr("right_window_size", -1)
    for rule in (
        diff >= 0 if c.attr("is_causal", 0) else None,
        diff <= left if left >= 0 else None,
        -diff <= right if right >= 0 else None,
    ):
        if rule is not None:
            allowed = rule if allowed is None else allowed & rule
    return allowed


@register("Attention")
def attention(c: NodeCall) -> tuple[Tensor, ...]:
    q, k, v = c.tensor(0), c.tensor(1), c.tensor(2)
    three_d = q.ndim == 3
    if three_d:
        hq, hkv = c.attr("q_num_heads"), c.attr("kv_num_heads")
        if hq is None or hkv is None:
            raise ValueError(f"{c.where}: 3-d inputs need q_num_heads and kv_num_heads")
        q, k, v = _heads(q, hq), _heads(k, hkv), _heads(v, hkv)
    elif q.ndim != 4:
        raise ValueError(f"{c.where}: Q must be 3-d or 4-d, got shape {q.shape}")
    batch, hq, sq, head = q.shape
    if c.has(4) != c.has(5):
        raise ValueError(f"{c.where}: past_key and past_value are given together or not at all")
    past = c.tensor(4).shape[2] if c.has(4) else 0
    if c.has(4):
        k, v = c.tensor(4).cat(k, dim=2), c.tensor(5).cat(v, dim=2)
    present_k, present_v = k, v
    skv = k.shape[2]
    scale = math.sqrt(c.attr("scale", 1 / math.sqrt(head)))  # each side scaled by its root, as ONNX says
    if k.shape[1] != hq:  # grouped queries: each key/value head serves hq / hkv consecutive query heads
        k, v = k.repeat_interleave(hq // k.shape[1], dim=1), v.repeat_interleave(hq // v.shape[1], dim=1)
    scores = (q * scale) @ (k * scale).transpose(-2, -1)
    softcap = c.attr("softcap", 0.0)
    if softcap > 0:
        scores = (scores / softcap).tanh() * softcap

    # the bias: an additive float mask, and -inf wherever a boolean mask, the position rules or padding forbid
    bias, allowed = None, None
    if c.has(3):
        mask = c.tensor(3)
        if mask.shape[-1] < skv:  # a mask for the new keys only: the rest are not attended
            fill = False if mask.dtype == dtypes.bool else -math.inf
            mask = mask.pad([(0, 0)] * (mask.ndim - 1) + [(0, skv - mask.shape[-1])], value=fill)
        if mask.dtype == dtypes.bool:
            allowed = mask
        else:
            bias = mask.cast(q.dtype)
    if c.has(6):
        seen = c.tensor(6).cast(dtypes.int64).reshape(batch, 1, 1, 1)
        offset = seen - sq
        j = Tensor.arange(skv, device=c.device).reshape(1, 1, 1, skv)
        allowed = j < seen if allowed is None else allowed & (j < seen)
    else:
        offset = Tensor.full((1, 1, 1, 1), past, dtype=dtypes.int64, device=c.device)
    positional = _allowed(c, sq, skv, offset)
    if positional is not None:
        allowed = positional if allowed is None else allowed & positional
    if allowed is not None:
        block = allowed.where(0.0, -math.inf).cast(q.dtype)
        bias = block if bias is None else bias + block
    with_bias = scores + bias if bias is not None else scores

    precision = c.attr("softmax_precision")
    logits = with_bias.cast(onnx_dtype(precision, c.where)) if precision is not None else with_bias
    probs = logits.softmax(axis=-1)
    if bias is not None:  # a query that may see no key at all: a zero row, not NaN
        masked_row = bias.max(axis=-1, keepdim=True) == -math.inf
        probs = masked_row.where(0.0, probs)
    probs = probs.cast(q.dtype)
    y = probs @ v
    if three_d:
        y = y.transpose(1, 2).reshape(batch, sq, -1)
    mode = c.attr("qk_matmul_output_mode", 0)
    qk_out = {0: scores, 1: scores, 2: with_bias, 3: probs}.get(mode)
    if qk_out is None:
        raise ValueError(f"{c.where}: qk_matmul_output_mode must be 0, 1, 2 or 3, got {mode}")
    qk_out = qk_out.expand(batch, hq, sq, skv).cast(q.dtype)
    return y, present_k, present_v, qk_out


@register("RotaryEmbedding")
def rotary_embedding(c: NodeCall) -> Tensor:
    x, cos, sin = c.tensor(0), c.tensor(1), c.tensor(2)
    shape = x.shape
    if x.ndim == 4:  # (batch, heads, seq, size) -> (batch, seq, heads, size)
        x = x.transpose(1, 2)
    elif x.ndim == 3:
        heads = c.attr("num_heads")
        if not heads:
            raise ValueError(f"{c.where}: a 3-d input needs num_heads")
        x = x.reshape(shape[0], shape[1], heads, shape[2] // heads)
    else:
        raise ValueError(f"{c.where}: the input must be 3-d or 4-d, got shape {shape}")
    dim = c.attr("rotary_embedding_dim", 0) or x.shape[3]
    rotated, kept = x[..., :dim], x[..., dim:]
    if c.has(3):  # the caches' rows at each token's position
        ids = c.tensor(3).cast(dtypes.int64)
        cos, sin = cos[ids], sin[ids]
    if cos.shape[-1] != dim // 2 or sin.shape[-1] != dim // 2:
        raise ValueError(f"{c.where}: the caches' last dim must be {dim // 2}, got {cos.shape[-1]} and {sin.shape[-1]}")
    cos, sin = cos.unsqueeze(2), sin.unsqueeze(2)
    interleaved = c.attr("interleaved", 0)
    if interleaved:  # pairs are neighbours (x0, x1), (x2, x3) ...
        x1, x2 = rotated[..., 0::2], rotated[..., 1::2]
    else:  # pairs are the two halves' elements
        x1, x2 = rotated[..., : dim // 2], rotated[..., dim // 2 :]
    real, imag = cos * x1 - sin * x2, sin * x1 + cos * x2
    if interleaved:
        rotated = real.unsqueeze(-1).cat(imag.unsqueeze(-1), dim=-1).reshape(rotated.shape)
    else:
        rotated = real.cat(imag, dim=-1)
    out = rotated.cat(kept, dim=-1) if kept.shape[-1] else rotated
    return out.reshape(shape) if len(shape) == 3 else out.transpose(1, 2)


@register("LinearAttention")
def linear_attention(c: NodeCall) -> tuple[Tensor, Tensor]:
    hq, hkv = c.attr("q_num_heads"), c.attr("kv_num_heads")
    if not hq or not hkv or hq % hkv:
        raise ValueError(f"{c.where}: q_num_heads ({hq}) must be a positive multiple of kv_num_heads ({hkv})")
    rule = c.attr("update_rule", "gated_delta")
    if rule not in ("linear", "gated", "delta", "gated_delta"):
        raise ValueError(f"{c.where}: update_rule must be linear, gated, delta or gated_delta, got {rule!r}")
    given = c.tensor(0).dtype
    wide = dtypes.float64 if given == dtypes.float64 else dtypes.float32  # (the recurrence of halves in float32)
    q, k, v = (_heads(c.tensor(i).cast(wide), h) for i, h in ((0, hq), (1, hkv), (2, hkv)))
    batch, _, steps, dk = q.shape
    dv = v.shape[-1]
    state = c.tensor(3).cast(wide) if c.has(3) else Tensor.zeros(batch, hkv, dk, dv, dtype=wide, device=c.device)
    gated, delta = rule in ("gated", "gated_delta"), rule in ("delta", "gated_delta")
    if gated and not c.has(4) or delta and not c.has(5):
        raise ValueError(f"{c.where}: update_rule {rule!r} needs {'decay' if gated else 'beta'}")
    # decay per key dim (B, H, T, dk, 1) or per head (B, H, T, 1, 1); beta per head (B, H or 1, T, 1)
    decay = c.tensor(4).cast(wide).exp() if gated else None
    if decay is not None:
        per_dim = decay.shape[-1] == hkv * dk
        decay = _heads(decay, hkv).unsqueeze(-1) if per_dim else decay.transpose(1, 2).reshape(batch, hkv, steps, 1, 1)
    beta = c.tensor(5).cast(wide).transpose(1, 2).unsqueeze(-1) if delta else None
    scale = c.attr("scale", 0.0) or 1 / math.sqrt(dk)
    outs = []
    for t in range(steps):
        kt, vt = k[:, :, t], v[:, :, t]  # (B, H, dk), (B, H, dv)
        if decay is not None:
            state = state * decay[:, :, t]
        if delta:  # move the value stored under k_t toward v_t by beta
            stored = (state * kt.unsqueeze(-1)).sum(axis=2)
            vt = beta[:, :, t] * (vt - stored)
        state = state + kt.unsqueeze(-1) * vt.unsqueeze(-2)
        shared = state.repeat_interleave(hq // hkv, dim=1) if hq != hkv else state
        outs.append((q[:, :, t].unsqueeze(-1) * shared).sum(axis=2) * scale)  # (B, Hq, dv)
    y = Tensor.stack(*outs, dim=1).reshape(batch, steps, hq * dv)
    return y.cast(given), state.cast(given)
