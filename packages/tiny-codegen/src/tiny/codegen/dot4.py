"""DOT4 written out: for a renderer without its own (RendererCaps.dot4 off), each DOT4 becomes the four products of
a's bytes, unsigned, and b's, signed, summed in int32 -- shifts, masks and products every renderer has, which the
vectorize pass then takes as it takes any other. Run on the lowered kernel, before vectorizing."""

from __future__ import annotations

from tiny.ir.device import RendererCaps
from tiny.ir.pattern import PatternMatcher, UPat, graph_rewrite
from tiny.ir.uop import Ops, UOp


def _byte_products(dot: UOp) -> UOp:
    a, b = dot.src
    total: UOp | None = None
    for shift in (0, 8, 16, 24):
        unsigned = (a if not shift else a.alu(Ops.SHR, a.const_like(shift))).alu(Ops.AND, a.const_like(0xFF))
        # the byte sign-extended: shifted to the top, then arithmetically back (b >> 24 for the top byte)
        high = b if shift == 24 else b.alu(Ops.SHL, b.const_like(24 - shift))
        signed = high.alu(Ops.SHR, b.const_like(24))
        product = unsigned * signed
        total = product if total is None else total + product
    assert total is not None
    return total


written_out = PatternMatcher([(UPat(Ops.DOT4, name="dot"), _byte_products)], name="dot4 written out")


def write_out_dot4(sink: UOp, ast: UOp, caps: RendererCaps) -> UOp:
    """The lowered kernel `sink` of `ast` with its DOT4s written out, unless the renderer writes them (caps.dot4) or
    the kernel has none (looked for in the AST, a node an op where the lowered kernel has one a lane)."""
    if caps.dot4 or all(u.op is not Ops.DOT4 for u in ast.toposort):
        return sink
    return graph_rewrite(sink, written_out, name="dot4 written out")
