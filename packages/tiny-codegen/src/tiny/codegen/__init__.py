"""tiny.codegen: a scheduled kernel AST -> a compiled program for one device.

`get_program` is the spine: choose the optimization actions (none with NOOPT, a timed search with BEAM,
the hand-written rules otherwise), then lower, simplify, vectorize, linearize, check, render and compile
(tiny.codegen.program lists those stages in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

from tiny.codegen.beam import beam_search
from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, kernel_name, lower
from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.program import Rendered, build_program, render_for, render_kernel, to_program
from tiny.ir.config import BEAM, DEBUG, NOOPT
from tiny.ir.device import Compiled, CompiledProgram, usable_cores
from tiny.ir.uop import UOp

__all__ = [
    "get_program",
    "get_programs",
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
    _print_plan(ast, device, chosen)
    return build_program(ast, device, chosen)


def get_programs(kernels: Sequence[tuple[UOp, Compiled]]) -> list[CompiledProgram]:
    """get_program for many kernels at once, as a schedule's cold start needs: each planned and rendered here, and
    handed to a compiler as soon as it is rendered, so that the compilers (a process, or a library call that lets go
    of the interpreter lock: clang, NVRTC, LLVM, COMGR) work on every core this process may use while the next
    kernels are rendered."""
    workers = min(usable_cores(), len(kernels))
    if workers <= 1:
        rendered = [(device, _planned_render(ast, device)) for ast, device in kernels]
        return [to_program(r, device, device.compile(r.src)) for device, r in rendered]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        jobs = []
        for ast, device in kernels:
            r = _planned_render(ast, device)
            jobs.append((device, r, pool.submit(device.compile, r.src)))
        return [to_program(r, device, job.result()) for device, r, job in jobs]


def _planned_render(ast: UOp, device: Compiled) -> Rendered:
    chosen = choose_opts(ast, device)
    _print_plan(ast, device, chosen)
    return render_kernel(ast, device, chosen)


def _print_plan(ast: UOp, device: Compiled, chosen: list[Opt] | None) -> None:
    if DEBUG >= 3 and chosen is not None:  # (the rules' are printed as they are chosen)
        plan = Kernel(ast, device.renderer.caps).apply_opts(chosen)
        print(f"{kernel_name(ast)}: {chosen} -> {plan.describe()}")
