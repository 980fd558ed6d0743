"""Rendering and compiling one kernel with a given list of optimization actions: the stages in order."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from tiny.codegen.dot4 import write_out_dot4
from tiny.codegen.linearize import linearize
from tiny.codegen.lower import LoweredKernel, kernel_name, lower_kernel
from tiny.codegen.narrow import narrow_loops
from tiny.codegen.opt import Kernel, Opt
from tiny.codegen.opt.heuristic import hand_opts
from tiny.codegen.vectorize import VectorTarget, vectorize
from tiny.ir import viz
from tiny.ir.config import DEBUG, flag
from tiny.ir.device import Compiled, CompiledProgram, Renderer, RendererCaps
from tiny.ir.dtypes import PtrDType
from tiny.ir.pattern import graph_rewrite
from tiny.ir.spec import validate, validate_ast
from tiny.ir.symbolic import symbolic
from tiny.ir.tensorcore import tensor_core
from tiny.ir.uop import GroupOp, Ops, UOp

REPLAY_RECORD = flag(
    "REPLAY_RECORD",
    str,
    "",
    "a folder: every kernel rendered is recorded there (its AST, actions, renderer and source) for process replay; "
    "set by `python -m tiny.replay record`",
)


@dataclass(frozen=True)
class Rendered:
    """A kernel lowered, linearized and rendered, not compiled yet."""

    kernel: LoweredKernel
    uops: list[UOp]
    src: str
    opts: tuple[Opt, ...] = ()  # the optimization actions applied


@dataclass(frozen=True)
class Lowered:
    """A plan after the passes that come before linearizing: lowered, simplified, narrowed and vectorized."""

    plan: Kernel
    kernel: LoweredKernel
    sink: UOp


@dataclass(frozen=True)
class Actions:
    """A kernel's optimization actions and who chose them: "given" (by the caller: a test, a replay), "NOOPT", "BEAM",
    or "the rules" (rules_actions: process replay chooses those again). The rules' come with their plan's Lowered,
    which they made to count its ops: the spine starts from it."""

    opts: tuple[Opt, ...]
    chosen_by: str = "given"
    lowered: Lowered | None = field(default=None, compare=False, repr=False)


# where the rules' actions make a kernel of more ops than this (lowered and simplified), they choose again with fewer
# values per thread (compile time grows with the ops: a fused LSTM cell's backward pass of 1600 AST nodes tiled as a
# matrix product was 30000 ops, 600 KB of C that clang took 7 s over, for a kernel of 240 iterations). The suite's
# kernels stay under 2700.
CODE_OPS = 4096


def rules_actions(ast: UOp, renderer: Renderer) -> Actions:
    """The hand-written rules' actions for the renderer's caps (tiny.codegen.opt.heuristic), held to CODE_OPS ops:
    while their plan lowers to more, they choose again with fewer values per thread."""
    validate_ast(ast)  # the scheduler's kernel is well formed (tiny.ir.spec)
    base, max_lanes = Kernel(ast, renderer.caps), None
    while True:
        opts = hand_opts(base, max_lanes)
        lowered = _lower_passes(base.copy().apply_opts(opts), renderer.caps)
        if (max_lanes := _fewer_lanes(lowered)) is None:
            return Actions(tuple(opts), "the rules", lowered)


def _fewer_lanes(lowered: Lowered) -> int | None:
    """Where a plan makes more than CODE_OPS ops, the values per thread to plan again with, in proportion (each value
    costs about the same code); None where it fits, or where a thread computes one value already."""
    size, lanes = len(lowered.sink.toposort), lowered.plan.lanes()
    if DEBUG >= 3:
        print(f"{lowered.kernel.name}: {lowered.plan.applied} -> {size} ops")
    if size <= CODE_OPS or lanes == 1:
        return None
    return min(lanes - 1, lanes * CODE_OPS // size)


def render_kernel(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = ()) -> Rendered:
    """Lower (after the optimization actions `opts`, the rules' if None), simplify, linearize, check and render a
    kernel; no compiling."""
    return render_for(ast, device.renderer, opts)


def render_for(ast: UOp, renderer: Renderer, opts: Sequence[Opt] | None = None) -> Rendered:
    """render_kernel for a renderer alone, no device: what compile-only tests of a GPU that is not here use.
    opts None: the hand-written rules' actions for the renderer's caps (rules_actions)."""
    return render(ast, renderer, rules_actions(ast, renderer) if opts is None else Actions(tuple(opts)))


def render(ast: UOp, renderer: Renderer, actions: Actions) -> Rendered:
    """A kernel rendered after the actions chosen for it; with VIZ, its passes recorded as one group."""
    if not viz.enabled():
        return _render(ast, renderer, actions)
    with viz.group("kernel", kernel_name(ast), renderer=f"{type(renderer).__name__} {renderer.target}".strip()) as g:
        r = _render(ast, renderer, actions)
        if g is not None:
            g.info |= {"actions": [repr(o) for o in r.opts], "chosen_by": actions.chosen_by}
            g.info |= {
                "global_size": str(r.kernel.global_size),
                "local_size": str(r.kernel.local_size),
                "source": r.src,
            }
    return r


def _render(ast: UOp, renderer: Renderer, actions: Actions) -> Rendered:
    """The spine after the actions are chosen, a line a pass (each in its own module)."""
    lowered = actions.lowered
    if lowered is None:  # (actions given, or BEAM's: the AST not checked yet; the rules' checked it in rules_actions)
        validate_ast(ast)  # the scheduler's kernel is well formed (tiny.ir.spec)
    if lowered is None or viz.recording():  # (VIZ records the passes of the plan rendered, in its group)
        lowered = _lower_passes(Kernel(ast, renderer.caps).apply_opts(list(actions.opts)), renderer.caps)
    plan, kernel = lowered.plan, lowered.kernel  # lowered, simplified, narrowed, vectorized (_lower_passes)
    if DEBUG >= 3:
        print(f"{kernel.name}: {plan.applied} ({actions.chosen_by}) -> {plan.describe()}")
    uops = linearize(lowered.sink)  # each op placed in its loop, in execution order (tiny.codegen.linearize)
    if viz.recording():
        viz.step("linearize", lowered.sink, uops)
    validate(uops)  # only device ops, each well formed (tiny.ir.spec)
    if DEBUG >= 5:
        print(format_uops(uops))
    rendered = Rendered(kernel, uops, renderer.render(kernel.name, uops), tuple(plan.applied))  # source
    if REPLAY_RECORD:  # process replay is recording (python -m tiny.replay record)
        from tiny.replay import record_kernel

        given = None if actions.chosen_by == "the rules" else list(actions.opts)
        record_kernel(ast, renderer, given, list(plan.applied), kernel.name, rendered.src)
    return rendered


def _lower_passes(plan: Kernel, caps: RendererCaps) -> Lowered:
    """The passes before linearizing, a line each."""
    kernel = _lower(plan)  # loads, stores (index memory), loops or hardware ids, lanes, REDUCEs (tiny.codegen.lower)
    sink = write_out_dot4(kernel.sink, plan.ast, caps)  # byte products, where the renderer has no DOT4 of its own
    sink = graph_rewrite(sink, symbolic, memo=kernel.simplified, name="symbolic")  # index math, constants
    sink = _narrowed(sink, caps)  # sums skip the iterations whose every lane reads padding (tiny.codegen.narrow)
    target = VectorTarget(caps.vector_width * 4, kernel.simplified, caps.narrow_vectors)  # (symbolic's memo)
    sink = graph_rewrite(sink, vectorize, ctx=target, name="vectorize")  # lanes alike become vector ops
    return Lowered(plan, kernel, sink)


def _lower(plan: Kernel) -> LoweredKernel:
    lowered = lower_kernel(plan)
    if viz.recording():
        viz.step(f"lower {plan.applied}", plan.ast, lowered.sink)
    return lowered


def _narrowed(sink: UOp, caps: RendererCaps) -> UOp:
    narrowed = narrow_loops(sink, caps)
    if viz.recording() and narrowed is not sink:
        viz.step("narrow loops", sink, narrowed)
    return narrowed


def format_uops(uops: list[UOp]) -> str:
    """One line per op: position, op, dtype, the positions of its sources, and its arg."""
    pos = {u: i for i, u in enumerate(uops)}
    return "\n".join(
        f"{i:4d} {u.op.name:<14} {u.dtype!r:<28} {str([pos[s] for s in u.src]):<16} {'' if u.arg is None else u.arg!r}"
        for i, u in enumerate(uops)
    )


def build_program(ast: UOp, device: Compiled, opts: Sequence[Opt] | None = ()) -> CompiledProgram:
    """The compiled program that runs kernel `ast` on `device`, after the optimization actions `opts` (None: the
    rules', held to CODE_OPS ops)."""
    r = render_kernel(ast, device, opts)
    return to_program(r, device, device.compile(r.src))


def to_program(r: Rendered, device: Compiled, binary: bytes) -> CompiledProgram:
    """A rendered kernel and its binary, with what a launch needs to know."""
    kernel, uops, src = r.kernel, r.uops, r.src
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
            mult *= u.end.arg if u.end.op is Ops.CONST else max(u.end.vmax, 0)  # (a narrowed loop: at most)
        elif u.op is Ops.ENDRANGE:
            mult = stack.pop()
        elif u.op is Ops.SPECIAL:
            mult *= u.arg[1]
        elif u.op in GroupOp.ALU and u not in index_math:
            flops += mult * u.dtype.count
        elif u.op is Ops.WMMA:  # each lane's share of the tile's multiply-adds
            m, n, k = tensor_core(u.arg).dims
            flops += mult * 2 * m * n * k // tensor_core(u.arg).threads
    mem = 0
    for u in uops:
        if u.op is Ops.DEFINE_GLOBAL and isinstance(u.dtype, PtrDType) and u.dtype.base is not None:
            mem += max(u.dtype.size, 0) * u.dtype.base.itemsize
    return flops, mem
