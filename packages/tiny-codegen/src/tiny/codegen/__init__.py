"""tiny.codegen: a scheduled kernel AST -> a compiled program for one device.

`get_program` is the spine: choose the optimization actions (none with NOOPT, a timed search with BEAM,
the hand-written rules otherwise), then lower, simplify, vectorize, linearize, check, render and compile
(tiny.codegen.program lists those stages in order).
"""

from __future__ import annotations

from collections.abc import Sequence

from tiny.codegen.beam import beam_search
from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, kernel_name, lower
from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.program import build_program, render_for, render_kernel
from tiny.ir.config import BEAM, DEBUG, NOOPT
from tiny.ir.device import Compiled, CompiledProgram
from tiny.ir.uop import UOp

__all__ = [
    "get_program",
    "choose_opts",
    "render_kernel",
    "render_for",
    "Kernel",
    "KernelOptError",
    "Opt",
    "OptOps",
    "LoweredKernel",
    "lower",
    "linearize",
]


def choose_opts(ast: UOp, device: Compiled) -> list[Opt] | None:
    """The optimization actions for a kernel on a device: none (NOOPT), searched (BEAM), or None for the rules',
    which render_for chooses as it lowers (held to a code size: see tiny.codegen.program.CODE_OPS)."""
    if NOOPT:
        return []
    if BEAM.value > 0:
        return beam_search(ast, device, BEAM.value)
    return None


def get_program(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = None) -> CompiledProgram:
    """The compiled program that runs kernel `ast` on `device`, after `opts` (chosen by choose_opts if None)."""
    chosen = choose_opts(ast, device) if opts is None else list(opts)
    if DEBUG >= 3 and chosen is not None:  # (the rules' are printed as they are chosen)
        plan = Kernel(ast, device.renderer.caps).apply_opts(chosen)
        print(f"{kernel_name(ast)}: {chosen} -> {plan.describe()}")
    return build_program(ast, device, chosen)
