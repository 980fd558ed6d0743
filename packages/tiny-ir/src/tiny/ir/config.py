"""Every environment flag tiny reads, declared once: name, type, default and what it does.

Read a flag with `DEBUG.value`; override it for a block of code with `with Context(DEBUG=2): ...`.
The README's table of flags is this table.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T", int, str)

# Flags are read on every op, so a read is a plain attribute: each flag keeps its parsed value in its __dict__ (see
# _Parsed) and forgets it when its variable is written or Context overrides it. Every write through os.environ
# (monkeypatch.setenv too) lands in the dict of encoded keys and values os.environ keeps on POSIX and Windows
# (os.environ._data); it is replaced here by _WatchedEnviron, which tells the flags of the written key. Where that dict
# is not there, a read looks the variable up every time.
_encode = getattr(os.environ, "encodekey", None)
_decode = getattr(os.environ, "decodevalue", None)
_WATCHING: dict[Any, list[Flag]] = {}  # each flag by its variable's encoded name


class _WatchedEnviron(dict):
    """os.environ's own dict (os._Environ writes it with these two, and nothing else): a write of a flag's variable
    has the flag parse it again when next read."""

    def __setitem__(self, key: Any, value: Any) -> None:
        super().__setitem__(key, value)
        for f in _WATCHING.get(key, ()):
            f.forget()

    def __delitem__(self, key: Any) -> None:
        super().__delitem__(key)
        for f in _WATCHING.get(key, ()):
            f.forget()


_ENV_DATA: dict | None = getattr(os.environ, "_data", None)
if type(_ENV_DATA) is dict and _encode is not None and _decode is not None:
    _ENV_DATA = os.environ._data = _WatchedEnviron(_ENV_DATA)  # type: ignore[attr-defined]
else:
    _ENV_DATA = None


class _Parsed:
    """Flag.value: the override in force or the environment's value parsed, kept in the flag's __dict__ (which a read
    then finds first: this descriptor has no __set__) until forget(); raises where the variable does not parse."""

    def __get__(self, flag: Flag | None, owner: type | None = None) -> Any:
        if flag is None:
            return self
        value = flag._override[-1] if flag._override else flag._parse(flag._environment())
        if _ENV_DATA is not None:
            flag.__dict__["value"] = value
        return value


@dataclass
class Flag(Generic[T]):
    name: str
    type: type[T]
    default: T
    doc: str
    _override: list[T] = field(default_factory=list, repr=False)
    _key: Any = field(default=None, init=False, repr=False, compare=False)  # the name as _ENV_DATA holds it
    value = _Parsed()  # (a plain attribute once read)

    def __post_init__(self) -> None:
        self._key = _encode(self.name) if _ENV_DATA is not None else self.name
        _WATCHING.setdefault(self._key, []).append(self)

    def forget(self) -> None:
        """The environment or an override changed: parse again at the next read."""
        self.__dict__.pop("value", None)

    def _environment(self) -> Any:
        return _ENV_DATA.get(self._key) if _ENV_DATA is not None else os.environ.get(self.name)

    def _parse(self, raw: Any) -> T:
        text = _decode(raw) if _ENV_DATA is not None and raw is not None else raw
        if text is None or text == "":
            return self.default
        try:
            return self.type(text)
        except ValueError:
            raise ValueError(
                f"environment flag {self.name}={text!r}: expected {self.type.__name__} (as {self.name}="
                f"{self.default}, its default); unset it or give it a value of that type"
            ) from None

    def __bool__(self) -> bool:
        return bool(self.value)

    def __int__(self) -> int:
        return int(self.value)

    def __ge__(self, other: int) -> bool:
        return int(self.value) >= other

    def __gt__(self, other: int) -> bool:
        return int(self.value) > other


FLAGS: dict[str, Flag] = {}


def flag(name: str, type_: type[T], default: T, doc: str) -> Flag[T]:
    """Declare a flag (each package declares its own, in the module that reads it): its name, type, default and what
    it does. A value in the environment that does not parse as the type fails here, when that module is imported."""
    if name in FLAGS:
        raise ValueError(f"flag {name} is declared twice")
    new = FLAGS[name] = Flag(name, type_, default, doc)
    _ = new.value
    return new


DEBUG = flag(
    "DEBUG",
    int,
    0,
    "1: devices and schedule sizes; 2: one line per kernel (name, sizes, time, GFLOPS, GB/s); "
    "3: the optimizations applied; 4: generated source; 5: the kernel's linearized UOps",
)
DEVICE = flag("DEVICE", str, "", "default device, e.g. CPU, PYTHON, NULL, CUDA:1; empty picks the fastest present")
CACHELEVEL = flag("CACHELEVEL", int, 2, "0: no disk cache of compiled programs; 2: use it")
CACHEDB = flag("CACHEDB", str, "", "path of the disk cache database; empty means <user cache dir>/tiny/cache.db")
NOOPT = flag("NOOPT", int, 0, "1: no kernel optimizations, every kernel runs as its loops were lowered")
BEAM = flag(
    "BEAM",
    int,
    0,
    "n > 0: search each kernel's optimizations with a beam of width n, timing candidates on the device; "
    "the winner is cached on disk",
)
SCHEDULE_CACHE = flag(
    "SCHEDULE_CACHE",
    int,
    1,
    "1: a graph with the structure of one scheduled before (other input buffers) reuses its schedule; 0: schedule "
    "every graph anew; 2: schedule anew and fail where the cached schedule differs (a test of the cache)",
)
PROFILE = flag(
    "PROFILE",
    str,
    "",
    "1: record every schedule, render, compile, kernel launch and copy (each kernel waited for and timed) and write "
    "them as Chrome trace-event JSON at exit, to tiny_profile_<pid>.json in the temporary folder; a path: write there",
)
VIZ = flag(
    "VIZ",
    str,
    "",
    "1: record each schedule and kernel pass by pass and serve the web page of tiny.viz on 127.0.0.1 (the port is "
    "printed), until Ctrl-C after the script ends; a path: save the trace there at exit, for python -m tiny.viz PATH",
)
VIZ_PORT = flag("VIZ_PORT", int, 0, "the port VIZ=1 serves on; 0: a free one")
TF32 = flag(
    "TF32",
    int,
    0,
    "1: float32 products on NVIDIA tensor cores (sm_80 and newer) multiply TF32 values, 10 mantissa bits of 23 (as "
    "PyTorch's allow_tf32, its default for convolutions), read when a CUDA device opens; 0: full float32",
)


def check_environment() -> None:
    """Parse every flag the environment sets, so that one that does not parse (BEAM=lots) fails when tiny is
    imported, naming the flag, its type and the value, even where this run would never read it."""
    for flag in FLAGS.values():
        _ = flag.value


@contextlib.contextmanager
def Context(**values: int | str) -> Iterator[None]:  # noqa: N802  (used like a class)
    """Override flags inside a with-block: `with Context(DEBUG=2, CACHELEVEL=0): ...`."""
    unknown = [name for name in values if name not in FLAGS]
    if unknown:
        raise KeyError(f"unknown flag(s) {unknown}; known flags: {sorted(FLAGS)}")
    for name, v in values.items():
        if not isinstance(v, FLAGS[name].type):
            kind = FLAGS[name].type.__name__
            raise TypeError(f"Context({name}={v!r}): flag {name} takes a value of type {kind}, got {type(v).__name__}")
    flags = []
    for name, v in values.items():
        FLAGS[name]._override.append(v)
        FLAGS[name].forget()
        flags.append(FLAGS[name])
    try:
        yield
    finally:
        for f in flags:
            f._override.pop()
            f.forget()


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tiny")


check_environment()  # a flag that does not parse fails here, at import, not in the middle of a run
