"""Process replay: show that a change to tiny renders every kernel the same (or which ones it changed).

`python -m tiny.replay record OUT -- <pytest args>` runs the tests with REPLAY_RECORD=OUT, so that every kernel they
render is written to OUT: its AST, the optimization actions it was given (or that the rules are to choose them), the
renderer, the flags set and the rendered source. `python -m tiny.replay compare OUT` renders each kernel again with the
code that imports now and lists the kernels whose source changed, with a diff.

A recording is a folder of files, one per process that rendered kernels (pytest-xdist workers too), each a pickle
stream: a header naming the format, then one KernelRecord per distinct kernel. A recording of another format is refused.
A recorded AST of an older form is brought to today's as it is read (`current_ast`), so a recording made before a change
of form compares after it.
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import importlib
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tiny.codegen.program import REPLAY_RECORD
from tiny.ir.config import FLAGS, Context
from tiny.ir.device import Renderer, renderer_entry_points
from tiny.ir.uop import Ops, UOp

FORMAT = 1  # the recording format: raise it when KernelRecord or what it holds changes meaning
PREFIX = "kernels-"  # recording files are PREFIX<pid>.pkl
UNRECORDED_FLAGS = ("DEBUG", "REPLAY_RECORD")  # flags that change no kernel's source


class RecordingError(ValueError):
    """A folder that holds no recording, or one this version of tiny cannot read."""


@dataclass(frozen=True)
class KernelRecord:
    """One kernel as a process rendered it."""

    name: str
    ast: bytes  # the kernel's AST, pickled (UOp pickles as a flat list of nodes)
    renderer: tuple[str, str, str]  # (module, class, target) of the renderer
    caps: bytes  # the renderer's caps, pickled as a dict of their fields
    opts: tuple[tuple[str, int, int], ...] | None  # the actions it was given as (op, axis, arg); None: the rules'
    chosen: tuple[tuple[str, int, int], ...]  # the actions applied (the rules' where opts is None)
    flags: tuple[tuple[str, Any], ...]  # flags away from their default when it was rendered
    src: str
    test: str  # the test that rendered it (PYTEST_CURRENT_TEST), or ""

    @property
    def key(self) -> bytes:
        """What makes two records the same kernel to replay (the test that rendered it aside)."""
        return hashlib.sha256(pickle.dumps((self.ast, self.renderer, self.caps, self.opts, self.flags))).digest()


# ---------------------------------------------------------------- recording (in the process that renders)


class _Recorder:
    """The open recording file of this process, and the kernels written to it."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.file, self.seen = folder, None, set()

    def write(self, record: KernelRecord) -> None:
        if record.key in self.seen:
            return
        self.seen.add(record.key)
        if self.file is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.file = open(self.folder / f"{PREFIX}{os.getpid()}.pkl", "ab")  # noqa: SIM115  (open for the process)
            pickle.dump({"format": FORMAT}, self.file)
        pickle.dump(record, self.file)
        self.file.flush()


_recorders: dict[tuple[str, int], _Recorder] = {}


def _actions(opts: Sequence[Any]) -> tuple[tuple[str, int, int], ...]:
    return tuple((o.op.name, o.axis, o.arg) for o in opts)


def record_kernel(ast: UOp, renderer: Renderer, opts: list | None, chosen: list, name: str, src: str) -> None:
    """Write one rendered kernel to the recording in REPLAY_RECORD (render_for calls this while it is set). Kernels
    of renderers defined outside tiny (a test's own) are left out: compare could not build them again. A renderer that
    wraps another as `inner` (the AMD mock's, which notes what it renders) is recorded as the one it wraps."""
    while isinstance(inner := getattr(renderer, "inner", None), Renderer):
        renderer = inner
    cls = type(renderer)
    if not cls.__module__.startswith("tiny."):
        return
    key = (os.path.abspath(REPLAY_RECORD.value), os.getpid())  # (a forked process writes a file of its own)
    recorder = _recorders.get(key) or _recorders.setdefault(key, _Recorder(Path(key[0])))
    caps = {f.name: getattr(renderer.caps, f.name) for f in dataclasses.fields(renderer.caps)}
    flags = tuple((n, f.value) for n, f in sorted(FLAGS.items()) if n not in UNRECORDED_FLAGS and f.value != f.default)
    recorder.write(
        KernelRecord(
            name=name,
            ast=pickle.dumps(ast),
            renderer=(cls.__module__, cls.__qualname__, renderer.target),
            caps=pickle.dumps(caps),
            opts=None if opts is None else _actions(opts),
            chosen=_actions(chosen),
            flags=flags,
            src=src,
            test=os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" (", 1)[0],
        )
    )


# ---------------------------------------------------------------- reading a recording


def load(folder: str | Path) -> list[KernelRecord]:
    """Every distinct kernel of a recording, in the order they were recorded (file by file)."""
    folder = Path(folder)
    files = sorted(folder.glob(f"{PREFIX}*.pkl")) if folder.is_dir() else []
    if not files:
        raise RecordingError(f"{folder}: no recording here (expected {PREFIX}*.pkl files, from `tiny.replay record`)")
    records: dict[bytes, KernelRecord] = {}
    for path in files:
        for record in _read(path):
            records.setdefault(record.key, record)
    return list(records.values())


def _read(path: Path) -> Iterator[KernelRecord]:
    with open(path, "rb") as f:
        try:
            header = pickle.load(f)
        except EOFError:
            return  # (a process that died before its first kernel was written)
        except Exception as e:
            raise RecordingError(f"{path}: not a recording this tiny can read ({type(e).__name__}: {e})") from None
        fmt = header.get("format") if isinstance(header, dict) else None
        if fmt != FORMAT:
            raise RecordingError(
                f"{path}: recording format {fmt}, this tiny reads format {FORMAT}; record again with this checkout "
                "(or compare with the tiny that recorded it)"
            )
        while True:
            try:
                yield pickle.load(f)
            except EOFError:
                return
            except pickle.UnpicklingError:  # a process killed in the middle of a record: its last one is cut off
                return


# ---------------------------------------------------------------- older forms of a kernel AST


def current_ast(ast: UOp) -> UOp:
    """A kernel AST in today's form. Before READ and WRITE, a kernel AST read and wrote its buffers with the ops a
    lowered kernel has: LOAD(DEFINE_GLOBAL, VIEW) and STORE(DEFINE_GLOBAL, VIEW, value) (a lowered LOAD or STORE has
    an INDEX first)."""
    done: dict[UOp, UOp] = {}
    for u in ast.toposort:
        src = tuple(done[s] for s in u.src)
        op = _CURRENT_OP.get(u.op, u.op) if src[:1] and src[0].op is Ops.DEFINE_GLOBAL else u.op
        done[u] = u if op is u.op and src == u.src else u.replace(op=op, src=src)
    return done[ast]


_CURRENT_OP = {Ops.LOAD: Ops.READ, Ops.STORE: Ops.WRITE}  # a kernel AST's memory ops as they were, and are


# ---------------------------------------------------------------- rendering a record again


def rebuild_renderer(record: KernelRecord) -> Renderer:
    """The record's renderer class built again for its target, with the recorded caps (a renderer reads the host it
    runs on: threads, vector width) on the fields the class still has."""
    module, qualname, target = record.renderer
    renderer = renderer_class(module, qualname)(target)
    caps = pickle.loads(record.caps)
    known = {f.name for f in dataclasses.fields(renderer.caps)}
    renderer.caps = dataclasses.replace(renderer.caps, **{k: v for k, v in caps.items() if k in known})
    return renderer


def renderer_class(module: str, qualname: str) -> Any:
    """The renderer class a record names. One that has moved to another module since it was recorded is found by
    its class name among the installed renderers (the `tiny.renderers` entry points), so that a recording made
    before a move compares after it."""
    try:
        cls: Any = importlib.import_module(module)
        for part in qualname.split("."):
            cls = getattr(cls, part)
        return cls
    except (ImportError, AttributeError):
        moved = [ep for ep in renderer_entry_points().values() if ep.attr == qualname]
        if len(moved) != 1:
            raise
        return moved[0].load()


def render_again(record: KernelRecord) -> str:
    """The source this checkout renders for the recorded kernel."""
    from tiny.codegen.opt import Opt, OptOps
    from tiny.codegen.program import render_for

    ast = current_ast(pickle.loads(record.ast))
    renderer = rebuild_renderer(record)
    opts = None if record.opts is None else [Opt(OptOps[op], axis, arg) for op, axis, arg in record.opts]
    flags = {name: value for name, value in record.flags if name in FLAGS}
    with Context(**flags, REPLAY_RECORD=""):
        return render_for(ast, renderer, opts).src


@dataclass(frozen=True)
class Outcome:
    record: KernelRecord
    status: str  # "same", "changed" or "error"
    detail: str = ""  # the diff, or the error


def check(record: KernelRecord) -> Outcome:
    try:
        src = render_again(record)
    except Exception as e:  # a kernel this checkout cannot render or a record it cannot read: reported, not raised
        return Outcome(record, "error", f"{type(e).__name__}: {e}")
    if src == record.src:
        return Outcome(record, "same")
    diff = difflib.unified_diff(
        record.src.splitlines(), src.splitlines(), "recorded", "this checkout", lineterm="", n=2
    )
    return Outcome(record, "changed", "\n".join(diff))


_TODO: list[KernelRecord] = []  # the records a compare's worker processes check (inherited by fork)


def _check_at(i: int) -> Outcome:
    return check(_TODO[i])


def compare(records: Sequence[KernelRecord], jobs: int = 1) -> list[Outcome]:
    """Render every record again, on `jobs` processes."""
    if jobs <= 1 or len(records) < 64 or sys.platform == "win32":
        return [check(r) for r in records]
    import multiprocessing

    _TODO[:] = records
    try:
        context = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(jobs, mp_context=context) as pool:
            return list(pool.map(_check_at, range(len(records)), chunksize=max(1, len(records) // (jobs * 8))))
    finally:
        _TODO.clear()
