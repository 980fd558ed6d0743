"""VIZ: what the scheduler and the code generator did to each graph, pass by pass, for the web page of tiny.viz.

With VIZ=1 every schedule and every kernel rendered is recorded as a group of steps, a step being a named pass of
the spine with the graph before and after it and, for a pass of rewrite rules, each rule that fired (the function
and its source line, the node it matched and what it became); a kernel's group also holds its optimization actions
and rendered source. The web page (tiny.viz) is served from the first group on, at 127.0.0.1 and a printed port, and
when the script ends it keeps serving until Ctrl-C. VIZ=path.json saves the trace there at exit instead, for
`python -m tiny.viz path.json`. Off (the default), the passes check `enabled()` once each and record nothing.
"""

from __future__ import annotations

import atexit
import json
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tiny.ir.config import VIZ
from tiny.ir.uop import UOp

FORMAT = 1  # the saved trace's format: raise it when what a trace holds changes meaning
MAX_NODES = 3000  # a graph with more nodes is cut to its last MAX_NODES (the ones nearest the root), said so
ARG_CHARS = 160  # an arg's text is cut to this many characters


class TraceError(ValueError):
    """A file that is not a VIZ trace, or one of another format."""


@dataclass
class Group:
    """One schedule or one kernel, and what each pass made of it."""

    kind: str  # "schedule" or "kernel"
    name: str
    info: dict[str, Any] = field(default_factory=dict)  # a kernel's renderer, actions and source
    steps: list[dict[str, Any]] = field(default_factory=list)


_groups: list[Group] = []
_local = threading.local()  # .open: the groups being recorded on this thread, innermost last
_started = False  # the page is served (VIZ=1) or the trace saved at exit (VIZ=path)
_lock = threading.Lock()


def enabled() -> bool:
    return VIZ.value not in ("", "0")


def groups() -> list[Group]:
    return list(_groups)


def clear() -> None:
    _groups.clear()


def _open() -> list[Group]:
    if (found := getattr(_local, "open", None)) is None:
        found = _local.open = []
    return found


@contextmanager
def group(kind: str, name: str, **info: Any) -> Iterator[Group | None]:
    """Record the passes inside the with-block as one group (None, and nothing recorded, while VIZ is off or while
    paused)."""
    if not enabled() or getattr(_local, "paused", 0):
        yield None
        return
    g = Group(kind, name, info)
    _groups.append(g)
    _start()
    stack = _open()
    stack.append(g)
    try:
        yield g
    finally:
        stack.pop()


@contextmanager
def paused() -> Iterator[None]:
    """Record nothing inside the with-block (a BEAM search renders hundreds of candidates)."""
    _local.paused = getattr(_local, "paused", 0) + 1
    try:
        yield
    finally:
        _local.paused -= 1


def recording() -> bool:
    """A group is open on this thread: its passes are being recorded."""
    return bool(getattr(_local, "open", None)) and enabled()


def step(name: str, before: UOp | Sequence[UOp] | None, after: UOp | Sequence[UOp], fired: Sequence = ()) -> None:
    """A pass of the open group: the graph before and after it, and the rules that fired as (pattern, rule function,
    node, what it became)."""
    if not (stack := getattr(_local, "open", None)):
        return
    stack[-1].steps.append(
        {
            "name": name,
            "before": None if before is None else graph(before),
            "after": graph(after),
            "rules": [_fired(pat, fn, old, new) for pat, fn, old, new in fired],
        }
    )


def _fired(pat: Any, fn: Callable, old: UOp, new: UOp) -> dict[str, Any]:
    code = getattr(fn, "__code__", None)
    where = f"{Path(code.co_filename).name}:{code.co_firstlineno}" if code is not None else repr(fn)
    rule = {"rule": where, "pattern": repr(pat), "code": _source_line(code)}
    return rule | {"before": _label(old), "after": _label(new)}


def _source_line(code: Any) -> str:
    if code is None:
        return ""
    try:
        lines = Path(code.co_filename).read_text().splitlines()
        return lines[code.co_firstlineno - 1].strip()
    except (OSError, IndexError):
        return ""


def _label(u: UOp) -> str:
    return f"{u.op.name} {u.dtype.name}" + ("" if u.arg is None else f" {_arg(u.arg)}")


def _arg(arg: Any) -> str:
    text = repr(arg)
    return text if len(text) <= ARG_CHARS else text[: ARG_CHARS - 3] + "..."


def graph(roots: UOp | Sequence[UOp]) -> dict[str, Any]:
    """A graph as the page draws it: its nodes in order (sources first), each with op, dtype, arg and its sources'
    ids. A sequence of UOps (a linearized kernel) keeps its order: each node's position is its place in it."""
    if isinstance(roots, UOp):
        nodes = list(roots.toposort)
        ordered = False
    else:
        seen: dict[UOp, None] = {}
        for r in roots:
            for u in r.toposort:
                seen.setdefault(u, None)
        nodes, ordered = list(seen), True
    cut = max(0, len(nodes) - MAX_NODES)
    nodes = nodes[cut:]
    ids = {u: i for i, u in enumerate(nodes)}
    out = [
        {
            "id": i,
            "op": u.op.name,
            "dtype": u.dtype.name,
            "arg": "" if u.arg is None else _arg(u.arg),
            "src": [ids[s] for s in u.src if s in ids],
        }  # fmt: skip
        for i, u in enumerate(nodes)
    ]
    return {"nodes": out, "linear": ordered, "cut": cut}


# ---------------------------------------------------------------- the trace as a file


def trace() -> dict[str, Any]:
    """Everything recorded, as the page reads it (and as a saved trace holds it), with PROFILE's spans if any."""
    from tiny.ir import profile

    return {
        "format": FORMAT,
        "groups": [{"kind": g.kind, "name": g.name, "info": g.info, "steps": g.steps} for g in _groups],
        "profile": profile.trace() if profile.events() else None,
    }


def save(path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(trace()))
    return path


def load(path: str | Path) -> dict[str, Any]:
    """A saved trace, checked to be one of this format."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as e:
        raise TraceError(f"{path}: not a VIZ trace ({type(e).__name__}: {e})") from None
    fmt = data.get("format") if isinstance(data, dict) else None
    if fmt != FORMAT:
        raise TraceError(f"{path}: VIZ trace format {fmt}, this tiny reads format {FORMAT}; record it again")
    return data


# ---------------------------------------------------------------- serving or saving


def _start() -> None:
    global _started
    with _lock:
        if _started:
            return
        _started = True
    if VIZ.value == "1":
        from tiny.viz import start_server

        start_server(trace)
    atexit.register(_at_exit)


def _at_exit() -> None:
    if VIZ.value == "1":
        from tiny.viz import serve_until_interrupted

        serve_until_interrupted()
    elif enabled():
        try:
            path = save(VIZ.value)
        except OSError as e:
            print(f"VIZ: could not save the trace to {VIZ.value}: {e}")
            return
        print(f"VIZ: {len(_groups)} schedules and kernels saved to {path}; view them with python -m tiny.viz {path}")
