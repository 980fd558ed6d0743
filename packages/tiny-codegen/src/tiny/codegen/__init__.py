"""tiny.codegen: a scheduled kernel AST -> a compiled program for one device.

`get_program` is the spine: choose the optimization actions (none with NOOPT, a timed search with BEAM,
the hand-written rules otherwise), then lower, simplify, vectorize, linearize, check, render and compile
(tiny.codegen.program lists those stages in order).
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, kernel_name, lower
from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.opt.beam import beam_search
from tiny.codegen.program import Rendered, render_for, render_kernel, to_program
from tiny.ir import profile, viz
from tiny.ir.config import BEAM, DEBUG, NOOPT
from tiny.ir.device import Compiled, CompiledProgram, usable_cores
from tiny.ir.spec import validate_ast
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
        validate_ast(ast)  # (the search plans on it before any render checks it)
        with viz.paused():  # (its candidates are not what a VIZ user looks for: the winner is rendered again)
            return beam_search(ast, device, BEAM.value)
    return None


def get_program(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = None) -> CompiledProgram:
    """The compiled program that runs kernel `ast` on `device`, after `opts` (chosen by choose_opts if None)."""
    r = _planned_render(ast, device, opts)
    return to_program(r, device, _compile_many(device, [r])[0])


COMPILE_TOGETHER = 4  # kernels a compiler run takes while another one is busy (but the schedule's last ones)


def get_programs(kernels: Sequence[tuple[UOp, Compiled]]) -> list[CompiledProgram]:
    """get_program for many kernels at once, as a schedule's cold start needs: each planned and rendered here, and
    handed to a compiler as soon as one is free (a process, or a library call that lets go of the interpreter lock:
    clang, NVRTC, LLVM, COMGR), on every core this process may use, while the next kernels are rendered. The kernels
    rendered while every compiler was busy go to the next free one together (Compiled.compile_many: one run of a
    C compiler for several kernels)."""
    workers = min(usable_cores(), len(kernels))
    if workers <= 1:
        rendered = [(device, _planned_render(ast, device)) for ast, device in kernels]
        return [to_program(r, device, _compile_many(device, [r])[0]) for device, r in rendered]
    done: list[Rendered] = []
    binaries: list[Future[list[bytes]]] = []  # each job's binaries, in the order of its kernels
    jobs: list[list[int]] = []  # the kernels (indices into done) of each job
    waiting: dict[Compiled, list[int]] = {}  # rendered kernels no job has taken yet, by device

    def hand_out(pool: ThreadPoolExecutor, free: int) -> None:
        # an idle compiler takes one kernel; beside a busy one, a few (each run costs a compiler's start)
        least = 1 if free == workers else COMPILE_TOGETHER
        for device in [d for d, todo in waiting.items() if len(todo) >= least][:free]:
            todo = waiting.pop(device)
            jobs.append(todo)
            binaries.append(pool.submit(_compile_many, device, [done[i] for i in todo]))

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for ast, device in kernels:
            done.append(_planned_render(ast, device))
            waiting.setdefault(device, []).append(len(done) - 1)
            hand_out(pool, workers - sum(not b.done() for b in binaries))
        for device, todo in list(waiting.items()):  # the last ones, shared out among the compilers
            del waiting[device]
            for share in range(workers):
                if part := todo[share::workers]:
                    jobs.append(part)
                    binaries.append(pool.submit(_compile_many, device, [done[i] for i in part]))
        out: list[CompiledProgram | None] = [None] * len(done)
        for todo, job in zip(jobs, binaries):
            for i, binary in zip(todo, job.result()):
                out[i] = to_program(done[i], kernels[i][1], binary)
    return [p for p in out if p is not None]


def _planned_render(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = None) -> Rendered:
    if not profile.enabled():
        chosen = choose_opts(ast, device) if opts is None else list(opts)
        _print_plan(ast, device, chosen)
        return render_kernel(ast, device, chosen)
    name = kernel_name(ast)
    if opts is None and BEAM.value > 0 and not NOOPT:  # (a search: its candidates rendered, compiled and timed)
        with profile.timed("codegen", f"BEAM {name}", "beam", device=device.name):
            chosen = choose_opts(ast, device)
    else:
        chosen = choose_opts(ast, device) if opts is None else list(opts)
    with profile.timed("codegen", name, "render", device=device.name) as args:
        _print_plan(ast, device, chosen)
        r = render_kernel(ast, device, chosen)
        args["actions"] = repr(chosen) if chosen is not None else "the rules'"
        args["global_size"], args["local_size"] = str(r.kernel.global_size), str(r.kernel.local_size)
    return r


def _compile_many(device: Compiled, rendered: list[Rendered]) -> list[bytes]:
    """Compiled.compile_many, a span on the calling thread's compiler track where profiling."""
    srcs = [r.src for r in rendered]
    if not profile.enabled():
        return [device.compile(srcs[0])] if len(srcs) == 1 else device.compile_many(srcs)
    names = [r.kernel.name for r in rendered]
    title = names[0] if len(names) == 1 else f"{len(names)} kernels"
    with profile.timed(profile.thread_track("compile"), title, "compile", device=device.name, kernels=names):
        return [device.compile(srcs[0])] if len(srcs) == 1 else device.compile_many(srcs)


def _print_plan(ast: UOp, device: Compiled, chosen: list[Opt] | None) -> None:
    if DEBUG >= 3 and chosen is not None:  # (the rules' are printed as they are chosen)
        plan = Kernel(ast, device.renderer.caps).apply_opts(chosen)
        print(f"{kernel_name(ast)}: {chosen} -> {plan.describe()}")
