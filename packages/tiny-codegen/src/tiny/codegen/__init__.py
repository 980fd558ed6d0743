"""tiny.codegen: a scheduled kernel AST -> a compiled program for one device.

`get_program` is the spine: every stage of code generation, in order.
"""

from __future__ import annotations

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, lower
from tiny.ir.config import DEBUG
from tiny.ir.device import Compiled, CompiledProgram
from tiny.ir.dtypes import PtrDType
from tiny.ir.pattern import graph_rewrite
from tiny.ir.spec import validate
from tiny.ir.symbolic import symbolic
from tiny.ir.uop import GroupOp, Ops, UOp

__all__ = ["get_program", "render_kernel", "LoweredKernel", "lower", "linearize"]


def render_kernel(ast: UOp, device: Compiled) -> tuple[LoweredKernel, list[UOp], str]:
    """Lower, simplify, linearize, check and render a kernel; no compiling."""
    renderer = device.renderer
    kernel = lower(ast, renderer.caps)  # loops or hardware ids, index math, REDUCEs
    sink = graph_rewrite(kernel.sink, symbolic)  # simplify index math and fold constants
    uops = linearize(sink)  # place each op in its loop, in execution order
    validate(uops)  # only device ops, each well formed
    if DEBUG >= 5:
        print(format_uops(uops))
    return kernel, uops, renderer.render(kernel.name, uops)


def format_uops(uops: list[UOp]) -> str:
    """One line per op: position, op, dtype, the positions of its sources, and its arg."""
    pos = {u: i for i, u in enumerate(uops)}
    return "\n".join(
        f"{i:4d} {u.op.name:<14} {u.dtype!r:<28} {str([pos[s] for s in u.src]):<16} {'' if u.arg is None else u.arg!r}"
        for i, u in enumerate(uops)
    )


def get_program(ast: UOp, device: Compiled) -> CompiledProgram:
    """The compiled program that runs kernel `ast` on `device`."""
    kernel, uops, src = render_kernel(ast, device)
    binary = device.compile(src)
    flops, mem = estimate(uops)
    globals_ = sorted((u for u in uops if u.op is Ops.DEFINE_GLOBAL), key=lambda u: u.arg)
    outs = tuple(
        sorted({u.address.pointer.arg for u in uops if u.op is Ops.STORE and u.address.pointer.op is Ops.DEFINE_GLOBAL})
    )
    return CompiledProgram(
        name=kernel.name,
        device=device.name,
        language=device.renderer.caps.language,
        src=src,
        binary=binary,
        n_buffers=len(globals_),
        outs=outs,
        var_names=tuple(u.arg[0] for u in uops if u.op is Ops.DEFINE_VAR),
        global_size=kernel.global_size,
        local_size=kernel.local_size,
        flops=flops,
        mem_bytes=mem,
    )


def estimate(uops: list[UOp]) -> tuple[int, int]:
    """Operations (not counting index math) and bytes of global memory touched, per launch."""
    index_math: set[UOp] = set()
    for u in uops:
        if u.op is Ops.INDEX:
            for s in u.src[1:]:
                index_math.update(x for x in s.toposort if x.op is not Ops.LOAD)
    flops, mult, stack = 0, 1, []
    for u in uops:
        if u.op is Ops.RANGE:
            stack.append(mult)
            mult *= u.end.arg if u.end.op is Ops.CONST else 1
        elif u.op is Ops.ENDRANGE:
            mult = stack.pop()
        elif u.op is Ops.SPECIAL:
            mult *= u.arg[1]
        elif u.op in GroupOp.ALU and u not in index_math:
            flops += mult
    mem = 0
    for u in uops:
        if u.op is Ops.DEFINE_GLOBAL and isinstance(u.dtype, PtrDType) and u.dtype.base is not None:
            mem += max(u.dtype.size, 0) * u.dtype.base.itemsize
    return flops, mem
