"""TinyJit: capture the kernels a function runs, then replay them on new inputs without Python in between.

The first call of a function with a given signature runs it as usual (it compiles its kernels and makes any
state it needs); the second call records every kernel and copy it runs; later calls replay that recording with
the new inputs' buffers in place of the recorded ones. Buffers that live only inside the function are planned:
two whose lifetimes do not overlap share one allocation.

Never silently wrong: the signature (each tensor argument's shape, dtype and device, which arguments are the same
tensor, and every non-tensor argument) picks the recording, so a change captures again; reading values inside a
captured function (.numpy(), .item(), bool(t) ... and so Python control flow that depends on data) raises
JitError; drawing random numbers inside raises JitError (a replay would repeat them); an input that is a buffer the
function writes (an earlier output, or state it updates) raises JitError.

What a replay cannot see: tensors the function reads from outside (closures, attributes) are the recorded ones;
replace their values in place (assign) rather than rebinding the name. Outputs are the recorded buffers: the
next call overwrites them, so copy an output you want to keep.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable, Hashable, Iterator
from dataclasses import dataclass, replace
from typing import Any, Generic, TypeVar

from tiny.ir import profile
from tiny.ir.config import PROFILE
from tiny.ir.device import LAUNCHERS, Buffer, Device, GraphLaunch, GraphReplay, buffer_of
from tiny.ir.schedule import is_realized, rebind_graph
from tiny.ir.sint import highest, unbind_size
from tiny.ir.uop import Ops, UOp, record_below
from tiny.tensor.creation import RNG
from tiny.tensor.realize import JitError, Launch, capture, launcher_of, report_copy, report_kernel
from tiny.tensor.shapes import prod
from tiny.tensor.tensor import Tensor

R = TypeVar("R")


@dataclass
class _Recording:
    launches: list[Launch]  # with planned buffers
    inputs: list[Buffer]  # the recorded input buffers, by input position
    written: set[Buffer]  # buffers the launches write, inputs excluded
    outputs: Any  # the function's result, with realized tensors as their UOps
    args: list[tuple[Any, ...]]  # per launch: the argument handles, with inputs to patch in
    patches: list[list[tuple[int, int]]]  # per launch: (argument position, input position)
    planned_bytes: tuple[int, int]  # bytes of internal buffers before and after planning
    graph: GraphReplay | None = None  # the device's one-submission replay, if it has one
    variables: tuple[str, ...] = ()  # the Variables its kernels take, by name (each call's values are launched)
    epoch: int = -1  # the LAUNCHERS.epoch its launches were given in
    given: tuple[int | None, ...] = ()  # each tensor of `outputs` in order: the input it is (its position), or None


class TinyJit(Generic[R]):
    """Wrap a function of tensors: `step = TinyJit(step)`, then call `step(x, y)` as before.

    >>> double = TinyJit(lambda x: (x * 2).realize())
    >>> [double(Tensor([i, i])).tolist() for i in range(3)]
    [[0, 0], [2, 2], [4, 4]]
    """

    def __init__(self, fn: Callable[..., R]) -> None:
        self.fn = fn
        self.calls: dict[Hashable, int] = {}
        self.recordings: dict[Hashable, _Recording] = {}
        self.replays = 0  # calls answered by replaying a recording
        functools.update_wrapper(self, fn)  # type: ignore[arg-type]

    def reset(self) -> None:
        """Forget every recording: the next calls warm up and capture again."""
        self.calls.clear()
        self.recordings.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> R:
        args, kwargs, tensors = _prepare(args, kwargs)
        values: dict[UOp, int] = {}  # the bound Variables given (as arguments, or in the tensors' shapes)
        key = _signature(args, kwargs, tensors, values)
        rec = self.recordings.get(key)
        if rec is not None:
            _write_pending()  # state assigned since the last call (a new learning rate ...) is what the replay reads
            self.replays += 1
            return _replay(rec, tensors, values)
        self.calls[key] = self.calls.get(key, 0) + 1
        if self.calls[key] == 1:  # warm up: compile, and let the function make its state
            return self.fn(*args, **kwargs)
        rec, out = self._capture(args, kwargs, tensors)
        self.recordings[key] = rec
        return out

    def _capture(self, args: tuple, kwargs: dict, tensors: list[Tensor]) -> tuple[_Recording, R]:
        inputs = [t._buffer() for t in tensors]
        rng, epoch = (RNG.seed, RNG.counter), LAUNCHERS.epoch
        _write_pending()  # state writes the warm-up left lazy happen now, not inside every replay
        with capture() as launches:
            out = self.fn(*args, **kwargs)
            results = [t for t in _leaves(out) if isinstance(t, Tensor)]
            if results:
                results[0].realize(*results[1:])
            _write_pending()  # state the function wrote lazily (running statistics ...) is part of each step
        if (RNG.seed, RNG.counter) != rng:
            raise JitError(
                "the function drew random numbers (Tensor.rand, dropout ...) while TinyJit captured it: every replay "
                "would repeat the same numbers. Draw them outside and pass them in as an argument."
            )
        rec = _record(launches, inputs, out, _given(args, kwargs, tensors))
        rec.epoch = epoch  # (a device opened while capturing: the first replay asks for the launches again)
        return rec, out


def _write_pending() -> None:
    """Realize every live tensor that holds a write into memory (an ASSIGN) not done yet."""
    pending = [t for t in Tensor._pending.alive() if _assigns(t.uop)]
    if pending:
        pending[0].realize(*pending[1:])


def _assigns(u: UOp) -> bool:
    """Whether a graph holds a write (an ASSIGN): kept on each node, so that the pending tensors every call looks
    at (a quantized model's weights are lazy graphs over their bytes) cost a lookup each, not a walk."""
    return record_below(u, _ASSIGNS, _holds_assign)


_ASSIGNS = "jit.assigns"  # the per-node record of _assigns


def _holds_assign(u: UOp) -> bool:
    return u.op is Ops.ASSIGN or any(s.__dict__[_ASSIGNS] for s in u.src)


def _prepare(args: tuple, kwargs: dict) -> tuple[tuple, dict, list[Tensor]]:
    """The arguments with each tensor realized into a whole buffer of its own, and the tensors in order."""
    tensors: list[Tensor] = []

    def whole(x: Any) -> Any:
        if not isinstance(x, Tensor):
            return x
        x.realize()
        if x.uop.op is Ops.MULTI:  # each device's part is an input of its own
            if not all(map(_is_whole_buffer, x.uop.src)):
                x = x.contiguous().realize()
            tensors.extend(x._operand(part) for part in x.uop.src)
            return x
        if not _is_whole_buffer(x.uop):
            x = x.contiguous().realize()
        tensors.append(x)
        return x

    new_args = tuple(whole(a) for a in args)
    new_kwargs = {k: whole(v) for k, v in sorted(kwargs.items())}
    return new_args, new_kwargs, tensors


def _is_whole_buffer(u: UOp) -> bool:
    if u.op is Ops.BUFFER:
        return True
    if u.op is not Ops.RESHAPE:
        return False
    (base,) = u.src
    if base.op is not Ops.BUFFER:
        return False
    shape = u.shape  # (a symbolic shape views its buffer's first elements: whole where its largest size fills it)
    n = math.prod(shape) if all(type(s) is int for s in shape) else highest(prod(shape))
    return base.shape == (n,)  # (a BUFFER's shape: its size)


def _memory(t: Tensor) -> Buffer:
    """The buffer of a tensor _prepare made a whole buffer of (without realize()'s checks, again)."""
    u = t.uop
    return buffer_of(u if u.op is Ops.BUFFER else u.src[0])


def _signature(args: tuple, kwargs: dict, tensors: list[Tensor], values: dict[UOp, int]) -> Hashable:
    """What a recording is valid for: tensor shapes, dtypes, devices and sharing, and the other arguments' values.
    A bound Variable counts by the Variable (its value goes into `values`): one recording for all of them."""
    first: dict[Buffer, int] = {}
    shapes = []
    for i, t in enumerate(tensors):  # (a loop: a comprehension is a call on Python 3.11; this runs every call)
        u = t.uop
        shapes.append((_unbound(u.shape, values), u.dtype, u.device, first.setdefault(_memory(t), i)))
    others = tuple(_static(a, values) for a in args) + tuple((k, _static(v, values)) for k, v in kwargs.items())
    return tuple(shapes), others


def _unbound(shape: tuple, values: dict[UOp, int]) -> tuple:
    for s in shape:
        if type(s) is not int:
            return tuple(unbind_size(s, values) if isinstance(s, UOp) else s for s in shape)
    return shape  # (sizes all ints: the shape itself)


def _given(args: tuple, kwargs: dict, tensors: list[Tensor]) -> frozenset[str]:
    """The names of the Variables a call binds (as arguments or in its tensors' shapes)."""
    values: dict[UOp, int] = {}
    _signature(args, kwargs, tensors, values)
    return frozenset(v.arg[0] for v in values)


def _static(x: Any, values: dict[UOp, int]) -> Hashable:
    if isinstance(x, Tensor):
        return Tensor
    if isinstance(x, UOp) and x.op is Ops.BIND:  # a bound Variable: the Variable, whatever its value
        return (UOp, unbind_size(x, values))
    if isinstance(x, (list, tuple)):
        return (type(x), tuple(_static(v, values) for v in x))
    if isinstance(x, dict):
        return (dict, tuple((k, _static(v, values)) for k, v in sorted(x.items())))
    try:
        hash(x)
    except TypeError:
        raise JitError(
            f"TinyJit keys its recordings by the non-tensor arguments, and a {type(x).__name__} cannot be a key: "
            "pass tensors, numbers, strings or tuples"
        ) from None
    return (type(x), x)


def _leaves(x: Any) -> list[Any]:
    if isinstance(x, (list, tuple)):
        return [leaf for v in x for leaf in _leaves(v)]
    if isinstance(x, dict):
        return [leaf for v in x.values() for leaf in _leaves(v)]
    return [x]


def _given_back(out: Any, inputs: list[Buffer]) -> tuple[int | None, ...]:
    """For each tensor of a function's result (in _leaves' order): the position of the input it is, or None."""
    position = {b: i for i, b in enumerate(inputs)}
    tensors = [t for t in _leaves(out) if isinstance(t, Tensor)]
    return tuple(None if t.uop.op is Ops.MULTI else position.get(t._buffer()) for t in tensors)


def _rebuild(x: Any, tensors: list[Tensor], given: Iterator[int | None]) -> Any:
    """The function's result with each tensor a new Tensor on the recorded (now overwritten) buffer, or the new
    input where the function returned an input (`given`: the input position of each tensor in turn, or None)."""
    if isinstance(x, Tensor):
        return tensors[place] if (place := next(given)) is not None else Tensor(x.uop)
    if isinstance(x, (list, tuple)):
        return type(x)(_rebuild(v, tensors, given) for v in x)
    if isinstance(x, dict):
        return {k: _rebuild(v, tensors, given) for k, v in x.items()}
    return x


def _record(launches: list[Launch], inputs: list[Buffer], out: Any, given: frozenset[str]) -> _Recording:
    """Plan the internal buffers of a capture and precompute each launch's arguments."""
    variables = tuple(dict.fromkeys(n for ln in launches if ln.program is not None for n in ln.program.var_names))
    if missing := [n for n in variables if n not in given]:
        raise JitError(
            f"the function's kernels take Variable(s) {', '.join(missing)}, bound outside it: a replay could not "
            "know their next values. Pass the bound Variable as an argument (or in an argument's shape)."
        )
    kept = {b for t in Tensor._live if is_realized(t.uop) for b in t._buffers()}  # what live tensors hold stays
    # memory the scheduler's planner shares already (a view and the buffer it views) keeps its plan: planned again
    # here by Buffer alone, the buffer could be given to another while its view is still read
    views = {b for ln in launches for b in ln.buffers if b.base is not None}
    internal = _internal(launches, set(inputs) | kept | views | {b.base for b in views})
    before = sum(b.nbytes for b in internal)
    plan = _plan(launches, internal)
    for b in internal:  # (the capture's last pass still holds its own: given back first, for the plan to take)
        if plan[b] is not b:
            b.release()
    launches = [replace(ln, buffers=tuple(plan.get(b, b) for b in ln.buffers)) for ln in launches]
    after = sum(b.nbytes for b in set(plan.values()))
    position = {b: i for i, b in enumerate(inputs)}
    args, patches = [], []
    for ln in launches:
        args.append(tuple(b.ensure_allocated().opaque for b in ln.buffers))
        patches.append([(j, position[b]) for j, b in enumerate(ln.buffers) if b in position])
    written = {b for ln in launches for j, b in enumerate(ln.buffers) if _writes(ln, j)} - set(inputs)
    graph = _graph(launches, args)
    rec = _Recording(launches, inputs, written, out, args, patches, (before, after), graph, variables)
    rec.given = _given_back(out, inputs)
    return rec


def _graph(launches: list[Launch], args: list[tuple[Any, ...]]) -> GraphReplay | None:
    """The device's graph executor for the captured kernels, where they are all kernels of one device that has one,
    on its memory alone, each over a fixed grid (a kernel's Variables, as a decode step's position, then passed to
    each replay by name)."""
    devices = {ln.program.device for ln in launches if ln.program is not None}
    if not launches or len(devices) != 1:
        return None
    graph = []
    for ln, a in zip(launches, args):
        prog = ln.program
        if prog is None or ln.runner is None or any(b.device != prog.device for b in ln.buffers):
            return None
        if not all(type(g) is int for g in prog.global_size):
            return None
        graph.append(GraphLaunch(ln.runner, a, prog.global_size, prog.local_size, var_names=tuple(prog.var_names)))
    return Device[devices.pop()].graph(graph)


def _writes(launch: Launch, j: int) -> bool:
    return j in launch.program.outs if launch.program is not None else j == 0


def _internal(launches: list[Launch], kept: set[Buffer]) -> list[Buffer]:
    """Buffers first written by the capture and held by nothing outside it."""
    seen: set[Buffer] = set()
    out: list[Buffer] = []
    for ln in launches:
        for j, b in enumerate(ln.buffers):
            if b not in seen:
                seen.add(b)
                if _writes(ln, j) and b not in kept:
                    out.append(b)
    return out


def _plan(launches: list[Launch], internal: list[Buffer]) -> dict[Buffer, Buffer]:
    """Map each internal buffer to one that is free over its lifetime (same device and size), reusing greedily."""
    wanted = set(internal)
    first: dict[Buffer, int] = {}
    last: dict[Buffer, int] = {}
    for i, ln in enumerate(launches):
        for b in ln.buffers:
            if b in wanted:
                first.setdefault(b, i)
                last[b] = i
    free: dict[tuple[str, int], list[Buffer]] = {}
    ending: dict[int, list[Buffer]] = {}
    plan: dict[Buffer, Buffer] = {}
    for i in range(len(launches)):
        for b in internal:
            if first.get(b) == i:
                pool = free.get((b.device, b.nbytes), [])
                plan[b] = pool.pop() if pool else b
                ending.setdefault(last[b], []).append(plan[b])
        for rep in ending.pop(i, []):  # free after this launch: a later launch may write it
            free.setdefault((rep.device, rep.nbytes), []).append(rep)
    return plan


def _replay(rec: _Recording, tensors: list[Tensor], values: dict[UOp, int]) -> Any:
    new = [_memory(t) for t in tensors]
    for i, b in enumerate(new):
        if b in rec.written:
            raise JitError(
                f"TinyJit input {i} is a buffer the jitted function writes (an earlier output, or state it updates): "
                "the replay would read it while overwriting it. Pass a copy (t.contiguous()) or a new tensor."
            )
    handles = [b.ensure_allocated().opaque for b in new]
    if rec.epoch != LAUNCHERS.epoch:
        _relaunch(rec)
    if PROFILE.value and profile.enabled():  # each launch on its own, waited for and timed
        _replay_profiled(rec, handles, dict(zip(rec.inputs, new)), {v.arg[0]: n for v, n in values.items()})
    elif rec.graph is not None:  # one submission: each launch's arguments, with the new inputs patched in
        args = [_patched(a, p, handles) if p else a for a, p in zip(rec.args, rec.patches)]
        rec.graph(args, {v.arg[0]: n for v, n in values.items()})
    else:
        _replay_launches(rec, handles, dict(zip(rec.inputs, new)), {v.arg[0]: n for v, n in values.items()})
    outputs = _rebound(rec.outputs, values) if rec.variables else rec.outputs
    return _rebuild(outputs, tensors, iter(rec.given))


def _relaunch(rec: _Recording) -> None:
    """The recording's kernel launches asked for again: a runtime said the launchers it gave before are stale. (A
    kernel whose grid is over its Variables launches through its runner, one that reads other devices' memory through
    launch_with: neither is a launcher.)"""
    rec.epoch = LAUNCHERS.epoch
    rec.launches = [
        replace(ln, launch=launch, with_values=bool(p.var_names))
        if (p := ln.program) is not None
        and ln.runner is not None
        and all(b.device == p.device for b in ln.buffers)
        and (launch := launcher_of(p, ln.runner)) is not None
        else ln
        for ln in rec.launches
    ]


def _replay_launches(rec: _Recording, handles: list[Any], swap: dict[Buffer, Buffer], by_name: dict[str, int]) -> None:
    for ln, args, patches in zip(rec.launches, rec.args, rec.patches):
        if ln.program is None:  # a copy between devices
            dest, src = (swap.get(b, b) for b in ln.buffers)
            dest.copy_from(src)
            continue
        if patches:
            args = list(args)
            for j, k in patches:
                args[j] = handles[k]
        if ln.with_values:  # (a kernel's launch, given this call's values of its Variables)
            ln.launch(*args, *[by_name[n] for n in ln.program.var_names])  # type: ignore[misc]
        elif ln.program.var_names:  # (its grid over them, or it reads other devices' memory: the runner's call)
            prog = ln.program
            vals = tuple(by_name[n] for n in prog.var_names)
            ln.runner(*args, global_size=prog.grid(vals), local_size=prog.local_size, vals=vals)  # type: ignore[misc]
        else:
            ln.launch(*args)  # type: ignore[misc]  (a kernel's launch)


def _replay_profiled(rec: _Recording, handles: list[Any], swap: dict[Buffer, Buffer], by_name: dict[str, int]) -> None:
    """_replay_launches with each launch waited for and recorded as a span (tiny.ir.profile)."""
    for ln, args, patches in zip(rec.launches, rec.args, rec.patches):
        start = time.perf_counter()
        if ln.program is None:
            dest, src = (swap.get(b, b) for b in ln.buffers)
            dest.copy_from(src)
            report_copy(dest, src, start, time.perf_counter() - start, False, True)
            continue
        prog, args = ln.program, _patched(args, patches, handles)
        vals = tuple(by_name[n] for n in prog.var_names)
        runner: Any = ln.runner
        for b in ln.buffers:  # (a kernel that reads other devices' memory: what they were given first is done)
            Device[b.device].synchronize()
        seconds = runner(*args, global_size=prog.grid(vals), local_size=prog.local_size, vals=vals, wait=True)
        report_kernel(prog, vals, start, seconds, False, True)


def _rebound(x: Any, values: dict[UOp, int]) -> Any:
    """The recorded result with its symbolic shapes bound to this call's values."""
    if isinstance(x, Tensor):  # (a result of fixed shape has nothing to bind)
        return Tensor(rebind_graph(x.uop, values)) if any(type(s) is not int for s in x.shape) else x
    if isinstance(x, (list, tuple)):
        return type(x)(_rebound(v, values) for v in x)
    if isinstance(x, dict):
        return {k: _rebound(v, values) for k, v in x.items()}
    return x


def _patched(args: tuple[Any, ...], patches: list[tuple[int, int]], handles: list[Any]) -> tuple[Any, ...]:
    out = list(args)
    for j, k in patches:
        out[j] = handles[k]
    return tuple(out)
