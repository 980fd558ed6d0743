"""Quantized weights multiplied as bytes, as llama.cpp multiplies them.

A GGUF weight of integer blocks times a scale (Q8_0: 32 int8 and a float16 scale a block; Q4_0: 32 nibbles less 8)
is kept by tiny.nn.gguf, where the device multiplies bytes (`tiny.ir.schedule.layout.byte_dot_rows`), as int32 words
of four quants with `lanes` rows side by side: words (rows / lanes, blocks, words a block, lanes) and scales (rows /
lanes, blocks, lanes). The weight itself stays the float32 graph over them that every other reader computes; the
words are registered for it as its form (tiny.tensor.weight_forms), and `linear` calls their `product`.

A product x @ weight.T then rounds each block of 32 of x to int8 with its own scale (the largest magnitude / 127,
kept as float16: llama.cpp's quantize_row_q8_0), packs them four a word, and sums each block's products in int32,
four at a time (Ops.DOT4: the weight's bytes unsigned, x's signed, so Q8_0's quants are offset by 128 and Q4_0's
nibbles taken as they are, each offset taken back as that many times the sum of x's block; Q8_0's as they are, both
signed, in Ops.SDOT4 where the renderer has it faster: RendererCaps.sdot4), then scales the block's sum by both
scales and adds it up in float32. One kernel over the words: each lane a row, x's words broadcast.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from tiny.ir.device import Device
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops, UOp
from tiny.tensor.shapes import prod

if TYPE_CHECKING:
    from tiny.tensor.tensor import Tensor

BLOCK = 32  # quants a block
WORDS = BLOCK // 4  # int32 words of x a block
_LOW_NIBBLES = 0x0F0F0F0F
_TOP_BITS = -0x7F7F7F80  # 0x80808080 as int32: an int8's top bit flipped makes it unsigned, offset by 128


@dataclass(frozen=True, eq=False)
class ByteBlocks:
    """A weight (rows, k) as int32 words of its blocks' quants, `lanes` rows side by side, and its float16 scales."""

    words: Tensor  # (rows / lanes, k / 32, 4 (Q4_0) or 8 (Q8_0), lanes) int32
    scales: Tensor  # (rows / lanes, k / 32, lanes) float16
    nibbles: bool  # Q4_0: word m's low nibbles are quants 4m .. 4m+3, its high ones 16+4m ..; less 8 each

    @property
    def lanes(self) -> int:
        return self.words.shape[-1]

    @property
    def rows(self) -> int:
        return self.words.shape[0] * self.lanes

    @property
    def blocks(self) -> int:
        return self.words.shape[1]

    def split(self, t: Tensor) -> Tensor:
        """(rows / lanes, blocks, n, lanes) -> (rows / lanes, lanes, blocks, n), a view: row r at (r // lanes, r %
        lanes). (Not reshaped to (rows, ...): no view of the words is, and a copy would be made.)"""
        return t.permute(0, 3, 1, 2)

    @property
    def split_scales(self) -> Tensor:
        """The scales as float32, (rows / lanes, lanes, blocks): a view of the float16s, widened."""
        return self.words._new(self._graphs[0])

    @property
    def terms(self) -> list[Tensor]:
        """The weight's 8 words of unsigned bytes a block, (1, rows / lanes, lanes, blocks) each, in the order of the
        input's words."""
        return [self.words._new(u) for u in self._graphs[1:]]

    @functools.cached_property
    def _graphs(self) -> tuple[UOp, ...]:
        """split_scales' and terms' graphs, built once (a prompt's products are built again each time) and kept as
        graphs, not tensors: a live tensor is looked over by every realize."""
        words = self.split(self.words)
        if self.nibbles:
            terms = [(words[..., m] >> shift) & _LOW_NIBBLES for shift in (0, 4) for m in range(4)]
        elif self.signed:
            terms = [words[..., g] for g in range(WORDS)]
        else:
            terms = [words[..., g] ^ _TOP_BITS for g in range(WORDS)]
        scales = self.scales.permute(0, 2, 1).cast(dtypes.float32)
        return (scales.uop, *(t.reshape(1, *t.shape).uop for t in terms))

    @functools.cached_property
    def signed(self) -> bool:
        """Whether the terms are the quants themselves, signed (Q8_0's, where the renderer takes SDOT4 faster)."""
        return not self.nibbles and Device[self.words.device].renderer.caps.sdot4

    def product(self, x: Tensor) -> Tensor:
        return byte_product(x, self)

    @property
    def offset(self) -> int:
        """What the terms' bytes hold over the quants: 8 for Q4_0's nibbles, 128 for Q8_0's flipped int8, 0 signed."""
        return 8 if self.nibbles else 0 if self.signed else 128


def byte_product(x: Tensor, form: ByteBlocks) -> Tensor:
    """x @ weight.T over its words, x float32 (..., k): as llama.cpp's vec_dot_q8_0_q8_0 / vec_dot_q4_0_q8_0."""
    lead, blocks = x.shape[:-1], form.blocks
    words, sums, dx = _rounded(x, blocks)
    shape = (prod(lead), *form.words.shape[:1], form.lanes, blocks)
    total = x._new(_dots(form._graphs[1:], words, shape, Ops.SDOT4 if form.signed else Ops.DOT4))
    if form.offset:
        total = total - sums * form.offset
    out = (total.cast(dtypes.float32) * (form.split_scales * dx)).sum(axis=-1)  # (n, groups, lanes)
    return out.reshape(*lead, form.rows)


def _dots(terms: Sequence[UOp], words: Sequence[UOp], shape: tuple[int, ...], op: Ops) -> UOp:
    """The sum of DOT4(term, word) (op: DOT4 or SDOT4) over a block's words: each term (1, groups, lanes, blocks) and
    word (n, 1, 1, blocks) broadcast to `shape`. Built as the graph directly: through Tensor's ops (checks,
    broadcasting, a tensor each) a prompt's 113 products took 150 ms more to build than their kernels take to run."""
    total: UOp | None = None
    for term, word in zip(terms, words):
        a, b = (u if u.shape == shape else UOp(Ops.EXPAND, u.dtype, (u,), shape) for u in (term, word))
        dot = a.alu(op, b)
        total = dot if total is None else total + dot
    assert total is not None
    return total


# the input last rounded: its node, and the graphs of its words (one a word of each block), block sums and scales;
# the products that read one input (a layer's query, key and value) build them once. Graphs, not tensors: a live
# tensor is looked over (and its graph rewritten) by every realize. (The node itself is the key: realizing anything
# it reads makes the input's tensor hold another node.)
_last: list[tuple[UOp, tuple[UOp, ...]]] = []


def _rounded(x: Tensor, blocks: int) -> tuple[tuple[UOp, ...], Tensor, Tensor]:
    """x (..., blocks * 32) rounded to int8 a block (quantize_row_q8_0): the graphs of its words (n, 1, 1, blocks),
    one for each word of a block, and each block's sum of quants and its scale (n, 1, 1, blocks)."""
    if _last and _last[0][0] is x.uop:
        *words_, sums_, dx_ = _last[0][1]
        return tuple(words_), x._new(sums_), x._new(dx_)
    n = prod(x.shape[:-1])
    xb = x.reshape(n, blocks, BLOCK)
    scale = xb.abs().max(axis=-1, keepdim=True) / 127
    v = xb * (scale > 0).where(1 / scale, 0.0)
    q = (v + (v < 0).where(-0.5, 0.5)).cast(dtypes.int32)  # (roundf: halves away from 0), -127 .. 127
    by_byte = q.reshape(n, blocks, WORDS, 4).permute(0, 2, 1, 3)
    packed = by_byte.shrink((None, None, None, (0, 1))) & 0xFF
    for i in range(1, 4):
        packed = packed + ((by_byte.shrink((None, None, None, (i, i + 1))) & 0xFF) << (8 * i))
    xw = packed.reshape(n, WORDS, blocks).contiguous()  # (n, 8, blocks): x's word g of each block
    words = tuple(_word(xw.uop, g) for g in range(WORDS))
    sums = q.sum(axis=-1, dtype=dtypes.int32).reshape(n, 1, 1, blocks).contiguous()
    dx = scale.reshape(n, 1, 1, blocks).cast(dtypes.float16).cast(dtypes.float32)
    _last[:] = [(x.uop, (*words, sums.uop, dx.uop))]
    return words, sums, dx


def _word(words: UOp, g: int) -> UOp:
    """Word g of each block, (n, 1, 1, blocks), of the input's words (n, 8, blocks): a view."""
    n, _, blocks = words.shape
    view = UOp(Ops.SHRINK, words.dtype, (words,), ((0, n), (g, g + 1), (0, blocks)))
    return UOp(Ops.RESHAPE, words.dtype, (view,), (n, 1, 1, blocks))
