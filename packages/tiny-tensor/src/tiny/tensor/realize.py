"""The realize engine: run a schedule's kernels and copies, and count what ran."""

from __future__ import annotations

import functools
import operator
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import NamedTuple

from tiny.codegen import get_program, get_programs
from tiny.ir import profile
from tiny.ir.config import BEAM, DEBUG, NOOPT, PROFILE
from tiny.ir.device import LAUNCHERS, Buffer, CompiledProgram, Device, Program
from tiny.ir.schedule import ScheduleItem
from tiny.ir.uop import Ops, UOp


@dataclass
class _Counters:
    """What has run since the last reset: kernels, copies, estimated work, and device time."""

    kernels: int = 0
    copies: int = 0
    flops: int = 0
    mem_bytes: int = 0
    time_s: float = 0.0

    def reset(self) -> None:
        self.kernels = self.copies = self.flops = self.mem_bytes = 0
        self.time_s = 0.0


GlobalCounters = _Counters()


@dataclass(frozen=True)
class Launch:
    """One kernel or copy that ran, as TinyJit records it: replaying it runs the same program on the same buffers."""

    buffers: tuple[Buffer, ...]
    program: CompiledProgram | None = None  # None: a copy from buffers[1] into buffers[0]
    runner: Program | None = None
    launch: Callable[..., None] | None = None  # the runner's launch on the buffers' opaques (Program.launcher)
    with_values: bool = False  # ... which takes the values of the program's Variables after them


class JitError(RuntimeError):
    """Something TinyJit cannot replay correctly, said at the call that would go wrong."""


_captures: list[list[Launch]] = []  # the recordings open now (TinyJit captures); every run is added to the innermost


def capturing() -> bool:
    return bool(_captures)


def _release_unheld(launches: list[Launch]) -> None:
    """The memory of each buffer a capture's launches alone hold (no tensor, graph or view reads it any more) goes
    back to its allocator, for the launches still to come; TinyJit plans such buffers again when it records. Held to
    the end instead, every buffer of a captured pass was in memory at once: a 32-token prompt's, 53 MB beside a 480
    MB model."""
    held: dict[Buffer, int] = {}
    for ln in launches:
        for b in ln.buffers:
            held[b] = held.get(b, 0) + 1
    for b in held:  # (its references then: the launches', `held`'s key, the loop's name and getrefcount's argument)
        if b.base is None and b.is_allocated and not b.foreign and sys.getrefcount(b) == held[b] + 3:
            b.release()


@contextmanager
def capture() -> Iterator[list[Launch]]:
    """Record every kernel and copy that runs inside the with-block."""
    launches: list[Launch] = []
    _captures.append(launches)
    try:
        yield launches
    finally:
        _captures.pop()


class Built(NamedTuple):
    """A kernel built for a device: the program, its loaded runner, and the runner's call that launches it on the
    kernel's buffers (then its Variables' values) without waiting (Program.launcher); None where its grid is over
    its Variables (each launch is then the runner's call with the grid of its values)."""

    program: CompiledProgram
    runner: Program
    launch: Callable[..., None] | None


Programs = dict[tuple[UOp, str], Built]
# the programs kept per flag set; past it the oldest built goes (and its runner is unloaded once nothing else holds
# it: a jitted function holds its own), so a process that builds many thousand kernels keeps a bounded number
KEEP_PROGRAMS = 4096
_programs_by_opts: dict[tuple[int, int], Programs] = {}  # (NOOPT, BEAM) -> the programs built under those flags
_epoch = [0]  # the LAUNCHERS.epoch their launches were given in
_opaque = operator.attrgetter("opaque")  # a buffer's memory, allocated when first asked for
_COPY = Ops.COPY  # (an Enum member as a global: see tiny.ir.schedule.cache._BUFFER)


def programs() -> Programs:
    """The programs built in this process under the optimization flags in force now, by kernel AST and device: a
    kernel run under another NOOPT or BEAM is built again, under those."""
    if LAUNCHERS.epoch != _epoch[0]:
        _launches_current()
    key = (NOOPT.value, BEAM.value)
    if (found := _programs_by_opts.get(key)) is None:
        found = _programs_by_opts[key] = {}
    return found


def _launches_current() -> None:
    """Every kept program's launch asked for again where a runtime said the launchers it gave before are stale (a
    device opened: asked at each schedule, and within one after what may open a device -- a build, a copy, a kernel
    that reads other devices' memory -- so that no launch given before runs after one given since)."""
    if LAUNCHERS.epoch == _epoch[0]:
        return
    _epoch[0] = LAUNCHERS.epoch
    for built in _programs_by_opts.values():
        for key, (prog, runner, _) in built.items():
            built[key] = Built(prog, runner, launcher_of(prog, runner))


def launcher_of(prog: CompiledProgram, runner: Program) -> Callable[..., None] | None:
    """The runner's launch of the program on its buffers' opaques, then its Variables' values, with the program's grid
    (Program.launcher); None where the grid is over its Variables."""
    if not all(type(g) is int for g in prog.global_size):
        return None
    return runner.launcher(prog.n_buffers, prog.global_size, prog.local_size, len(prog.var_names))


def compiled(ast: UOp, device: str) -> tuple[CompiledProgram, Program]:
    """The compiled and loaded program for a kernel AST on a device, built once per process (and flags)."""
    return _compiled(ast, device, programs())[:2]


def _compiled(ast: UOp, device: str, built: Programs) -> Built:
    key = (ast, device)
    if (found := built.get(key)) is None:
        found = _loaded(key, get_program(ast, Device[device]), built)
    return found


def _loaded(key: tuple[UOp, str], prog: CompiledProgram, built: Programs) -> Built:
    if DEBUG >= 4:
        print(prog.src)
    runner = Device[key[1]].load(prog)
    launch = launcher_of(prog, runner)
    while len(built) >= KEEP_PROGRAMS:
        del built[next(iter(built))]
    built[key] = Built(prog, runner, launch)
    _launches_current()  # (its device may have opened just now)
    return built[key]


def _build_ahead(items: list[ScheduleItem], built: Programs) -> None:
    """The kernels of a schedule not built yet, built together before the first runs: their compilers run side by
    side on every core (a cold first training step compiles a hundred kernels). Under BEAM each is searched in turn."""
    todo: dict[tuple[UOp, str], None] = {}
    for ast, buffers in items:
        if ast.op is not _COPY and (ast, buffers[0].device) not in built:
            todo[(ast, buffers[0].device)] = None
    if len(todo) < 2:
        return
    for key, prog in zip(todo, get_programs([(ast, Device[device]) for ast, device in todo])):
        _loaded(key, prog, built)


def _values(prog: CompiledProgram, var_vals: dict[str, int] | None) -> tuple[int, ...]:
    missing = [n for n in prog.var_names if var_vals is None or n not in var_vals]
    if missing:
        raise ValueError(f"kernel {prog.name} takes Variable(s) {', '.join(missing)}, which are not bound to values")
    return tuple(var_vals[n] for n in prog.var_names)  # type: ignore[index]


def run_schedule(items: list[ScheduleItem], var_vals: dict[str, int] | None = None) -> None:
    """Run a schedule's steps in order; var_vals: the value of each Variable its kernels take (by name)."""
    debug, built, profiling = DEBUG.value, programs(), bool(PROFILE.value) and profile.enabled()
    timed = debug >= 2 or profiling  # each launch waited for and timed (DEBUG=2 prints it, PROFILE records it)
    if debug >= 1 and items:
        kernels = sum(1 for i in items if i.ast.op is Ops.SINK)
        print(f"schedule: {kernels} kernel(s), {len(items) - kernels} copy(ies)")
    if len(items) > 1:  # (one step builds its own kernel below)
        _build_ahead(items, built)
    if _captures:
        _release_unheld(_captures[-1])
    for item in items:
        ast, buffers = item
        if ast.op is _COPY:
            out, src = buffers
            start = time.perf_counter()
            out.copy_from(src)
            GlobalCounters.copies += 1
            if _captures:
                _captures[-1].append(Launch((out, src)))
            if timed:
                report_copy(out, src, start, time.perf_counter() - start, debug >= 2, profiling)
            _launches_current()
            continue
        device = buffers[0].device
        if (found := built.get((ast, device))) is None:
            found = _compiled(ast, device, built)
        prog, runner, launch = found
        vals: tuple[int, ...] = ()
        given: tuple[int, ...] = ()  # (the values the launch takes after the opaques)
        if prog.var_names:  # a kernel over symbolic sizes: their values are its integer arguments
            vals = _values(prog, var_vals)
            if launch is None:  # (its grid over them)
                launch = functools.partial(runner, global_size=prog.grid(vals), local_size=prog.local_size, vals=vals)
            else:
                given = vals
        others = False
        for b in buffers:  # (a loop, not a call: asked of every launch, and nearly always all on one device)
            if b.device != device:  # it reads other devices' memory: launched when they meet it
                launch, others = _launch_with(device, _other_devices(buffers, device), runner, prog, vals), True
                given = ()
                _launches_current()
                break
        assert launch is not None
        if not timed:  # (the usual run: launched, not waited for; the opaques allocated when first asked for)
            if given:
                launch(*map(_opaque, buffers), *given)
            else:  # (no list built for the values: nearly every launch)
                launch(*map(_opaque, buffers))
        if _captures:
            _captures[-1].append(Launch(buffers, prog, runner, launch, bool(given)))
        GlobalCounters.kernels += 1
        GlobalCounters.flops += prog.flops
        GlobalCounters.mem_bytes += prog.mem_bytes
        if timed and others:
            start = time.perf_counter()
            launch(*map(_opaque, buffers))
            Device[device].synchronize()
            elapsed = time.perf_counter() - start
            GlobalCounters.time_s += elapsed
            report_kernel(prog, vals, start, elapsed, debug >= 2, profiling)
        elif timed:
            opaques, start = map(_opaque, buffers), time.perf_counter()
            elapsed = runner(*opaques, global_size=prog.grid(vals), local_size=prog.local_size, vals=vals, wait=True)
            GlobalCounters.time_s += elapsed
            report_kernel(prog, vals, start, elapsed, debug >= 2, profiling)


def _other_devices(buffers: tuple[Buffer, ...], device: str) -> tuple[str, ...]:
    """The devices other than `device` whose memory a kernel's buffers are (a collective's kernel on devices that
    share memory reads each device's part where it lies); usually none."""
    others: tuple[str, ...] = ()
    for b in buffers:
        if b.device != device and b.device not in others:
            others += (b.device,)
    return others


def _launch_with(
    device: str, others: tuple[str, ...], runner: Program, prog: CompiledProgram, vals: tuple[int, ...]
) -> Callable[..., None]:
    """A launch of a kernel that reads other devices' memory: through its device's launch_with, which has it wait for
    what they were given before, and them for it."""
    dev, grid, local = Device[device], prog.grid(vals), prog.local_size
    with_devices = tuple(Device[d] for d in others)
    return lambda *opaques: dev.launch_with(with_devices, runner, opaques, grid, local, vals)


def report_kernel(
    prog: CompiledProgram, vals: tuple[int, ...], start: float, seconds: float, show: bool, keep: bool
) -> None:
    """A timed kernel launch: printed (DEBUG=2) and/or recorded as a span on its device's track (PROFILE)."""
    gflops = prog.flops / seconds / 1e9 if seconds > 0 else 0.0
    if show:
        gbs = prog.mem_bytes / seconds / 1e9 if seconds > 0 else 0.0
        at = f" with {', '.join(f'{n}={v}' for n, v in zip(prog.var_names, vals))}" if vals else ""
        print(
            f"*** {prog.device:<8} {GlobalCounters.kernels:4d} {prog.name:<28} "
            f"{seconds * 1e3:9.3f} ms {gflops:9.2f} GFLOPS {gbs:8.2f} GB/s{at}"
        )
    if keep:
        args = {"global_size": str(prog.grid(vals)), "local_size": str(prog.local_size), "GFLOPS": round(gflops, 3)}
        args |= {"flops": prog.flops, "bytes": prog.mem_bytes} | dict(zip(prog.var_names, vals))
        profile.span(prog.device, prog.name, "kernel", start, seconds, **args)


def report_copy(out: Buffer, src: Buffer, start: float, seconds: float, show: bool, keep: bool) -> None:
    if show:
        print(f"*** copy {src.device} -> {out.device} {out.nbytes / 1e6:9.3f} MB {seconds * 1e3:8.3f} ms")
    if keep:
        profile.span(out.device, f"copy {src.device} -> {out.device}", "copy", start, seconds, bytes=out.nbytes)
