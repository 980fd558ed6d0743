"""PROFILE: a timeline of every schedule, render, compile, kernel launch and copy, as Chrome trace-event JSON.

With PROFILE=1 (or PROFILE=path.json) each of those is recorded as a span on a track (the device a kernel ran on, the
scheduler, the code generator, each compiler thread) and the trace is written when the process exits, to the path
given or to tiny_profile_<pid>.json in the temporary folder, and the path is printed. Perfetto (ui.perfetto.dev) and
chrome://tracing open it. A kernel's span lasts the time the device measured for it (each launch waits for the
kernel to finish while profiling, as DEBUG=2 does); its start and every other span are host clock readings.

Off (the default), the stages check `enabled()` once per call and record nothing.
"""

from __future__ import annotations

import atexit
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tiny.ir.config import PROFILE

_events: list[dict[str, Any]] = []
_tracks: dict[str, int] = {}  # track name -> its tid in the trace, in order of first use
_armed = False  # the trace is written at exit
_lock = threading.Lock()


def enabled() -> bool:
    return PROFILE.value not in ("", "0")


def span(track: str, name: str, cat: str, start: float, seconds: float, /, **args: Any) -> None:
    """A finished piece of work: `start` from time.perf_counter(), lasting `seconds`."""
    global _armed
    with _lock:
        tid = _tracks.setdefault(track, len(_tracks) + 1)
        if not _armed:
            _armed = True
            atexit.register(_write_at_exit)
    event = {"name": name, "cat": cat, "ph": "X", "ts": start * 1e6, "dur": max(seconds, 0.0) * 1e6}
    _events.append(event | {"pid": os.getpid(), "tid": tid, "args": args})


@contextmanager
def timed(track: str, name: str, cat: str, /, **args: Any) -> Iterator[dict[str, Any]]:
    """A span around the with-block; the block may add to the dict it is given (the span's args)."""
    start = time.perf_counter()
    try:
        yield args
    finally:
        span(track, name, cat, start, time.perf_counter() - start, **args)


def thread_track(kind: str) -> str:
    """A track for work of `kind` on the calling thread: `kind` on the main thread, `kind <n>` on the others."""
    thread = threading.current_thread()
    return kind if thread is threading.main_thread() else f"{kind} {thread.name.rsplit('_', 1)[-1]}"


def events() -> list[dict[str, Any]]:
    """The spans recorded so far."""
    return list(_events)


def clear() -> None:
    _events.clear()


def trace() -> dict[str, Any]:
    """The trace as the trace-event format's JSON object: metadata naming the process and each track, then spans."""
    pid = os.getpid()
    meta: list[dict[str, Any]] = [{"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": "tiny"}}]
    for track, tid in _tracks.items():
        meta.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid, "args": {"name": track}})
        meta.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid, "args": {"sort_index": tid}})
    return {"traceEvents": meta + list(_events), "displayTimeUnit": "ms"}


def write(path: str | Path) -> Path:
    path = Path(path)
    path.write_text(json.dumps(trace()))
    return path


def default_path() -> Path:
    value = PROFILE.value
    if value in ("", "0", "1"):
        return Path(tempfile.gettempdir()) / f"tiny_profile_{os.getpid()}.json"
    return Path(value)


def _write_at_exit() -> None:
    if not _events:
        return
    try:
        path = write(default_path())
    except OSError as e:
        print(f"PROFILE: could not write the trace to {default_path()}: {e}")
        return
    print(f"PROFILE: {len(_events)} spans written to {path} (open it in https://ui.perfetto.dev or chrome://tracing)")
