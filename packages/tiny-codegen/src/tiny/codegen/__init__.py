"""tiny.codegen: a scheduled kernel AST -> a compiled program for one device.

`get_program` is the spine: choose the optimization actions (choose_opts: none with NOOPT, a timed search with
BEAM, the hand-written rules otherwise), then lower, simplify, narrow, vectorize, linearize, check and render
(tiny.codegen.program lists those passes in order) and compile.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import replace

from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, kernel_name, lower
from tiny.codegen.opt import Kernel, KernelOptError, Opt, OptOps
from tiny.codegen.opt.beam import beam_search
from tiny.codegen.program import Actions, Rendered, render, render_for, render_kernel, rules_actions, to_program
from tiny.ir import profile, viz
from tiny.ir.config import BEAM, NOOPT
from tiny.ir.device import Compiled, CompiledProgram, usable_cores
from tiny.ir.spec import validate_ast
from tiny.ir.uop import UOp

__all__ = [
    "get_program",
    "get_programs",
    "choose_opts",
    "Actions",
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


def choose_opts(ast: UOp, device: Compiled) -> Actions:
    """The optimization actions for a kernel on a device, the one place they are chosen: none (NOOPT), searched
    (BEAM), or the hand-written rules', held to a code size (tiny.codegen.program.rules_actions)."""
    if NOOPT:
        return Actions((), "NOOPT")
    if BEAM.value > 0:
        validate_ast(ast)  # (the search plans on it before any render checks it)
        with viz.paused():  # (its candidates are not what a VIZ user looks for: the winner is rendered again)
            return Actions(tuple(beam_search(ast, device, BEAM.value)), "BEAM")
    return rules_actions(ast, device.renderer)


def get_program(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = None) -> CompiledProgram:
    """The compiled program that runs kernel `ast` on `device`, after `opts` (chosen by choose_opts if None)."""
    program = _described(ast, device, opts)  # the actions chosen; lowered ... rendered (tiny.codegen.program)
    return replace(program, binary=_compile_many(device, [program])[0])  # compiled


COMPILE_TOGETHER = 4  # kernels a compiler run takes while another one is busy (but the schedule's last ones)


def get_programs(kernels: Sequence[tuple[UOp, Compiled]]) -> list[CompiledProgram]:
    """get_program for many kernels at once, as a schedule's cold start needs: each planned and rendered here, and
    handed to a compiler as soon as one is free (a process, or a library call that lets go of the interpreter lock:
    clang, NVRTC, LLVM, COMGR), on every core this process may use, while the next kernels are rendered. The kernels
    rendered while every compiler was busy go to the next free one together (Compiled.compile_many: one run of a
    C compiler for several kernels). Each kernel's lowered graph is let go as soon as it is rendered: a schedule's
    new kernels held side by side until all were compiled were most of the memory a decode step's capture took."""
    workers = min(usable_cores(), len(kernels))
    if workers <= 1:
        return [get_program(ast, device) for ast, device in kernels]
    done: list[CompiledProgram] = []  # each kernel rendered and described, its binary to come
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
            done.append(_described(ast, device))
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
                out[i] = replace(done[i], binary=binary)
    return [p for p in out if p is not None]


def _described(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = None) -> CompiledProgram:
    """The kernel rendered and described as a program without its binary yet (the rendering let go of)."""
    return to_program(_planned_render(ast, device, opts), device, b"")


def _planned_render(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = None) -> Rendered:
    if not profile.enabled():
        return render(ast, device.renderer, choose_opts(ast, device) if opts is None else Actions(tuple(opts)))
    name = kernel_name(ast)
    searched = opts is None and BEAM.value > 0 and not NOOPT
    if searched:  # (a search: its candidates rendered, compiled and timed)
        with profile.timed("codegen", f"BEAM {name}", "beam", device=device.name):
            actions = choose_opts(ast, device)
    with profile.timed("codegen", name, "render", device=device.name) as args:
        if not searched:  # (the rules' choice lowers its plan: part of rendering)
            actions = choose_opts(ast, device) if opts is None else Actions(tuple(opts))
        r = render(ast, device.renderer, actions)
        args["actions"], args["chosen_by"] = repr(list(r.opts)), actions.chosen_by
        args["global_size"], args["local_size"] = str(r.kernel.global_size), str(r.kernel.local_size)
    return r


def _compile_many(device: Compiled, programs: list[CompiledProgram]) -> list[bytes]:
    """Compiled.compile_many, a span on the calling thread's compiler track where profiling."""
    srcs = [p.src for p in programs]
    if not profile.enabled():
        return [device.compile(srcs[0])] if len(srcs) == 1 else device.compile_many(srcs)
    names = [p.name for p in programs]
    title = names[0] if len(names) == 1 else f"{len(names)} kernels"
    with profile.timed(profile.thread_track("compile"), title, "compile", device=device.name, kernels=names):
        return [device.compile(srcs[0])] if len(srcs) == 1 else device.compile_many(srcs)
