"""DOT4 written out: for a renderer without its own (RendererCaps.dot4 off), each DOT4 becomes the four products of
a's bytes, unsigned, and b's, signed, summed in int32 (SDOT4's a's bytes signed too) -- shifts, masks and products
every renderer has, which the vectorize pass then takes as it takes any other. Run on the lowered kernel, before
vectorizing."""

from __future__ import annotations

from tiny.ir.device import RendererCaps
from tiny.ir.pattern import PatternMatcher, UPat, graph_rewrite
from tiny.ir.uop import GroupOp, Ops, UOp


def _byte_products(dot: UOp) -> UOp:
    a, b = dot.src
    total: UOp | None = None
    for shift in (0, 8, 16, 24):
        if dot.op is Ops.SDOT4:
            first = _signed_byte(a, shift)
        else:
            first = (a if not shift else a.alu(Ops.SHR, a.const_like(shift))).alu(Ops.AND, a.const_like(0xFF))
        product = first * _signed_byte(b, shift)
        total = product if total is None else total + product
    assert total is not None
    return total


def _signed_byte(x: UOp, shift: int) -> UOp:
    """x's byte at `shift`, sign-extended: shifted to the top, then arithmetically back (x >> 24 for the top byte)."""
    high = x if shift == 24 else x.alu(Ops.SHL, x.const_like(24 - shift))
    return high.alu(Ops.SHR, x.const_like(24))


written_out = PatternMatcher([(UPat(GroupOp.ByteDots, name="dot"), _byte_products)], name="dot4 written out")


def write_out_dot4(sink: UOp, ast: UOp, caps: RendererCaps) -> UOp:
    """The lowered kernel `sink` of `ast` with its DOT4s written out, unless the renderer writes them (caps.dot4) or
    the kernel has none (looked for in the AST, a node an op where the lowered kernel has one a lane)."""
    if caps.dot4 or all(u.op not in GroupOp.ByteDots for u in ast.toposort):
        return sink
    return graph_rewrite(sink, written_out, name="dot4 written out")
