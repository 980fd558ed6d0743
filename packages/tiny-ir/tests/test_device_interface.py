"""The device interface with no device at all: names, the allocator cache, the compile cache on disk, the disk
cache under several processes, flags and Context, lazy buffers."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
import sqlite3
import subprocess
import sys
import types
import weakref
from pathlib import Path
from typing import Any

import pytest

from tiny.ir import diskcache
from tiny.ir.config import CACHELEVEL, DEBUG, FLAGS, Context, Flag
from tiny.ir.device import (
    INTERFACE_VERSION,
    AllocatorCaps,
    Buffer,
    CompiledProgram,
    Compiler,
    Device,
    DeviceName,
    LRUAllocator,
    Program,
    Renderer,
    RendererCaps,
    UnknownDevice,
    buffer_of,
    new_buffer,
)
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops, UOp


@pytest.fixture
def cachedb(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "cache.db"
    monkeypatch.setenv("CACHEDB", str(path))
    monkeypatch.delenv("CACHELEVEL", raising=False)
    return path


# ---------------------------------------------------------------- device names


@pytest.mark.parametrize(
    "text, base, index, renderer, canonical",
    [
        ("CPU", "CPU", 0, None, "CPU"),
        ("cpu", "CPU", 0, None, "CPU"),
        ("cuda:1", "CUDA", 1, None, "CUDA:1"),
        ("CUDA:0", "CUDA", 0, None, "CUDA"),
        ("CPU:LLVM", "CPU", 0, "LLVM", "CPU:LLVM"),
        ("cpu:llvm", "CPU", 0, "LLVM", "CPU:LLVM"),
        ("cuda:2:ptx", "CUDA", 2, "PTX", "CUDA:2:PTX"),
        ("amd:ptx:3", "AMD", 3, "PTX", "AMD:3:PTX"),
        ("my_dev2", "MY_DEV2", 0, None, "MY_DEV2"),
    ],
)
def test_device_name_parse(text: str, base: str, index: int, renderer: str | None, canonical: str) -> None:
    name = DeviceName.parse(text)
    assert (name.base, name.index, name.renderer) == (base, index, renderer)
    assert str(name) == canonical
    assert DeviceName.parse(str(name)) == name


@pytest.mark.parametrize("bad", ["", ":1", "1CPU", "CPU:", "CPU::1", "CPU:1:2:3", "cpu-1", " CPU", "CPU 1", "CPU:1.5"])
def test_device_name_rejects(bad: str) -> None:
    with pytest.raises(UnknownDevice, match="device must be a string like"):
        DeviceName.parse(bad)


@pytest.mark.parametrize("ambiguous", ["CPU:1:2", "CPU:LLVM:PTX"])
def test_device_name_rejects_two_indices_or_two_renderers(ambiguous: str) -> None:
    with pytest.raises(UnknownDevice):
        DeviceName.parse(ambiguous)


def test_device_name_rejects_non_strings() -> None:
    for bad in (None, 1, b"CPU"):
        with pytest.raises(UnknownDevice):
            DeviceName.parse(bad)  # type: ignore[arg-type]


def test_unknown_devices() -> None:
    with pytest.raises(UnknownDevice, match="unknown device 'NOSUCHDEVICE'"):
        Device["NOSUCHDEVICE"]
    with pytest.raises(UnknownDevice):
        Device["not a name"]
    with pytest.raises(UnknownDevice):
        Device.canonicalize("NOSUCHDEVICE:1")
    assert issubclass(UnknownDevice, ValueError)


def test_interface_version() -> None:
    assert isinstance(INTERFACE_VERSION, tuple) and len(INTERFACE_VERSION) == 2
    assert all(isinstance(v, int) and v >= 0 for v in INTERFACE_VERSION)
    assert INTERFACE_VERSION >= (1, 0)


def test_capabilities_are_frozen_data() -> None:
    caps = RendererCaps(language="C")
    assert not caps.has_local and caps.vector_width == 1 and caps.dtypes == frozenset(dtypes.all())
    with pytest.raises(dataclasses.FrozenInstanceError):
        caps.has_local = True  # type: ignore[misc]
    assert AllocatorCaps() == AllocatorCaps(host_visible=False, transfer=False, aligned=16)
    prog = CompiledProgram("E_4", "CPU", "C", "src", b"bin", 2, (0,), ())
    assert prog.global_size == (1, 1, 1) and prog.local_size == (1, 1, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        prog.name = "x"  # type: ignore[misc]


def test_renderer_base_renders_nothing() -> None:
    r = Renderer("sm_90")
    assert r.target == "sm_90"
    with pytest.raises(NotImplementedError):
        r.render("k", [])


def test_a_programs_default_launcher_calls_it_with_the_grid_and_no_wait() -> None:
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    class Recording(Program):
        def __call__(self, *bufs: Any, **kw: Any) -> float | None:
            calls.append((bufs, kw))
            return None

    launch = Recording(None, "k", b"").launcher(2, (4, 1, 1), (8, 1, 1))  # type: ignore[arg-type]
    assert launch("out", "in") is None
    assert calls == [(("out", "in"), {"global_size": (4, 1, 1), "local_size": (8, 1, 1)})]
    # (1.13) a kernel over Variables: their values after the opaques, handed on as vals
    launch = Recording(None, "k", b"").launcher(2, (4, 1, 1), (8, 1, 1), n_vals=2)  # type: ignore[arg-type]
    assert launch("out", "in", 7, 9) is None
    assert calls[-1] == (("out", "in"), {"global_size": (4, 1, 1), "local_size": (8, 1, 1), "vals": (7, 9)})


# ---------------------------------------------------------------- buffers


def test_buffers_are_lazy() -> None:
    node = new_buffer("FAKE", 6, dtypes.float16)
    assert node.op is Ops.BUFFER and node.dtype == dtypes.float16 and node.shape == (6,) and node.device == "FAKE"
    buf = buffer_of(node)
    assert isinstance(buf, Buffer) and buf.size == 6 and buf.nbytes == 12 and not buf.is_allocated
    assert repr(buf) == "<Buffer FAKE 6 x float16 lazy>"
    assert new_buffer("FAKE", 6, dtypes.float16) is not node  # each is fresh memory
    with pytest.raises(ValueError, match="copyin of 4 bytes into a buffer of 12 bytes"):
        buf.copyin(memoryview(bytearray(4)))
    with pytest.raises(ValueError, match="copyout"):
        buf.copyout(memoryview(bytearray(13)))
    assert not buf.is_allocated


def test_a_buffer_lives_apart_from_its_node_and_dies_with_it() -> None:
    """A BUFFER node can sit in a reference cycle (its cached toposort holds it); a Buffer reachable from it would be
    finalized by the cycle collector together with its device memory. So the Buffer is not reachable from its node,
    yet dies when the node dies (in a cycle too), and a node made later never finds it."""
    node = new_buffer("FAKE", 4, dtypes.float32)
    assert node in node.toposort  # (a reference cycle)
    buf = buffer_of(node)
    seen, todo = set(), [node]
    while todo:  # what the node reaches, but through classes and modules (which reach every global)
        o = todo.pop()
        if id(o) not in seen and not isinstance(o, (type, types.ModuleType)):
            seen.add(id(o))
            todo.extend(gc.get_referents(o))
    assert id(buf) not in seen
    dead = weakref.ref(buf)
    del buf, node
    gc.collect()
    assert dead() is None
    for _ in range(100):  # (new nodes may take a dead one's memory, and so its id)
        node = new_buffer("FAKE", 2, dtypes.int8)
        assert buffer_of(node).size == 2
        with pytest.raises(KeyError, match="has no Buffer"):
            buffer_of(UOp(Ops.BUFFER, dtypes.int8, node.src, (-1, 2)))


# ---------------------------------------------------------------- the allocator cache


class CountingAllocator(LRUAllocator):
    """Hands out numbered handles; runs out of memory past `budget` bytes held (cached ones included)."""

    def __init__(self, budget: int = 1 << 30) -> None:
        super().__init__()
        self.budget, self.held, self.next = budget, 0, 0
        self.allocs: list[int] = []
        self.frees: list[tuple[Any, int]] = []

    def _alloc(self, size: int) -> Any:
        if self.held + size > self.budget:
            raise MemoryError
        self.held += size
        self.next += 1
        self.allocs.append(size)
        return ("handle", self.next)

    def _free(self, opaque: Any, size: int) -> None:
        self.held -= size
        self.frees.append((opaque, size))


def test_lru_allocator_reuses_freed_memory_of_the_same_size() -> None:
    a = CountingAllocator()
    x, y = a.alloc(16), a.alloc(16)
    assert x != y and a.allocs == [16, 16]
    a.free(x, 16)
    assert a.frees == []  # kept, not freed
    assert a.alloc(32) not in (x, y) and a.allocs == [16, 16, 32]
    assert a.alloc(16) == x and a.allocs == [16, 16, 32]  # the cached one comes back
    assert a.alloc(16) not in (x, y)


def test_lru_allocator_free_cache_frees_for_real() -> None:
    a = CountingAllocator()
    handles = [a.alloc(8) for _ in range(3)]
    for h in handles:
        a.free(h, 8)
    a.free_cache()
    assert sorted(a.frees) == sorted((h, 8) for h in handles)
    assert a.held == 0
    assert a.alloc(8) not in handles


def test_lru_allocator_empties_its_cache_when_memory_runs_out() -> None:
    a = CountingAllocator(budget=48)
    handles = [a.alloc(16) for _ in range(3)]
    a.free(handles[0], 16)
    a.free(handles[1], 16)
    big = a.alloc(32)  # 48 + 32 > budget: the two cached buffers are freed, then it fits
    assert big not in handles and len(a.frees) == 2 and a.held == 48
    with pytest.raises(MemoryError):
        a.alloc(64)


def test_a_buffer_the_device_cannot_hold_says_what_was_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    """An out-of-memory error names the bytes, the device and, where the allocator says, its memory."""
    a = CountingAllocator(budget=1000)  # (a device of its own: tiny-ir's tests run with no runtime installed)
    monkeypatch.setitem(Device._open, "SMALLMEM", types.SimpleNamespace(name="SMALLMEM", allocator=a))
    with pytest.raises(MemoryError, match=r"^SMALLMEM cannot allocate 4000 bytes .* for 1000 float32 values: it does"):
        Buffer("SMALLMEM", 1000, dtypes.float32).ensure_allocated()
    monkeypatch.setattr(a, "memory", lambda: (600, 1000))
    with pytest.raises(MemoryError, match=r"^SMALLMEM cannot allocate 2000 bytes .*: it has 600 bytes .* free of 1000"):
        Buffer("SMALLMEM", 1000, dtypes.int16).ensure_allocated()


# ---------------------------------------------------------------- the compile cache


class CountingCompiler(Compiler):
    def __init__(self, cachekey: str | None) -> None:
        super().__init__(cachekey)
        self.calls: list[str] = []

    def compile(self, src: str) -> bytes:
        self.calls.append(src)
        return b"bin:" + src.encode()


def test_compile_cached_hits_the_disk_cache(cachedb: Path) -> None:
    c = CountingCompiler("test:target-a")
    assert c.compile_cached("kernel one") == b"bin:kernel one"
    assert c.compile_cached("kernel one") == b"bin:kernel one"
    assert c.calls == ["kernel one"]
    assert cachedb.exists()
    again = CountingCompiler("test:target-a")  # a new compiler (a new process, say) finds it too
    assert again.compile_cached("kernel one") == b"bin:kernel one" and again.calls == []
    other_target = CountingCompiler("test:target-b")  # the key includes the compiler and target
    other_target.compile_cached("kernel one")
    assert other_target.calls == ["kernel one"]
    c.compile_cached("kernel two")
    assert c.calls == ["kernel one", "kernel two"]


def test_compile_cached_without_a_cachekey_always_compiles(cachedb: Path) -> None:
    c = CountingCompiler(None)
    c.compile_cached("k")
    c.compile_cached("k")
    assert c.calls == ["k", "k"]


def test_cachelevel_0_disables_the_disk_cache(cachedb: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CACHELEVEL", "0")
    c = CountingCompiler("test:nocache")
    c.compile_cached("k")
    c.compile_cached("k")
    assert c.calls == ["k", "k"]
    assert not cachedb.exists()
    with Context(CACHELEVEL=2):
        c.compile_cached("k")
        c.compile_cached("k")
    assert c.calls == ["k", "k", "k"]


def test_disk_cache_round_trips_python_values(cachedb: Path) -> None:
    value = {"binary": b"\x00\xff" * 100, "sizes": (1, 2, 3), "name": "r_4_8"}
    diskcache.cache_put("things", "key", value)
    assert diskcache.cache_get("things", "key") == value
    assert diskcache.cache_get("things", "missing") is None
    assert diskcache.cache_get("other_table", "key") is None
    diskcache.cache_put("things", "key", 2)  # a second put replaces
    assert diskcache.cache_get("things", "key") == 2


def test_cache_keys_are_blake2_and_load_no_openssl() -> None:
    """Keys are 256-bit BLAKE2b digests, made without hashlib's import, which maps OpenSSL's library into the
    process (3.6 MB resident, a tenth of a small model's memory over its weights) for nothing but a key."""
    import hashlib

    assert diskcache.digest(b"kernel") == hashlib.blake2b(b"kernel", digest_size=32).hexdigest()
    script = (
        "import sys\n"
        "from tiny.ir.device import Compiler\n"
        "class C(Compiler):\n"
        "    def compile(self, src): return src.encode()\n"
        "assert C('test:openssl').compile_cached('src') == b'src'\n"
        "print(sorted(m for m in sys.modules if 'hashlib' in m or m == '_ssl'))\n"
    )
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"


def test_a_damaged_entry_is_a_miss(cachedb: Path) -> None:
    diskcache.cache_put("things", "key", 1)
    conn = sqlite3.connect(cachedb)
    tables = [r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    conn.execute(f'UPDATE "{tables[0]}" SET value = ?', (b"not a pickle",))
    conn.commit()
    conn.close()
    assert diskcache.cache_get("things", "key") is None


def test_a_cache_that_cannot_open_is_no_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    monkeypatch.setenv("CACHEDB", str(blocker / "cache.db"))
    diskcache.cache_put("things", "key", 1)  # no error
    assert diskcache.cache_get("things", "key") is None
    c = CountingCompiler("test:unopenable")
    assert c.compile_cached("k") == b"bin:k" and c.compile_cached("k") == b"bin:k"
    assert c.calls == ["k", "k"]


def _writer(path: str, worker: int, n: int) -> None:
    os.environ["CACHEDB"] = path
    os.environ.pop("CACHELEVEL", None)
    for i in range(n):
        diskcache.cache_put("concurrent", f"{worker}:{i}", (worker, i, b"x" * 512))


def test_disk_cache_with_concurrent_writers(cachedb: Path) -> None:
    diskcache.cache_put("concurrent", "parent", "here first")  # this process holds a connection meanwhile
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(cachedb), w, 50)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    for w in range(4):
        for i in range(50):
            assert diskcache.cache_get("concurrent", f"{w}:{i}") == (w, i, b"x" * 512), (w, i)
    assert diskcache.cache_get("concurrent", "parent") == "here first"


# ---------------------------------------------------------------- flags


def test_flags_read_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEBUG", "3")
    assert DEBUG.value == 3 and DEBUG >= 3 and DEBUG > 2 and not DEBUG > 3 and int(DEBUG) == 3 and bool(DEBUG)
    monkeypatch.setenv("DEBUG", "")
    assert DEBUG.value == 0 and not DEBUG
    monkeypatch.delenv("DEBUG")
    assert DEBUG.value == DEBUG.default == 0
    monkeypatch.setenv("CACHELEVEL", "lots")
    with pytest.raises(ValueError, match="CACHELEVEL='lots': expected int"):
        _ = CACHELEVEL.value


@pytest.mark.parametrize("name, text", [("BEAM", "lots"), ("SCHEDULE_CACHE", "1.5"), ("VIZ_PORT", "four")])
def test_a_flag_that_does_not_parse_fails_at_import(name: str, text: str) -> None:
    """A flag this run never reads (VIZ_PORT without VIZ) is no more ignored than one it does: importing tiny fails,
    naming the flag, its type and the value given. (A package's own flags fail when its module is imported: the
    runtime's tests check THREADS.)"""
    env = {k: v for k, v in os.environ.items() if k not in FLAGS} | {
        name: text,
        "PYTHONPATH": os.pathsep.join(sys.path),
    }
    run = subprocess.run(
        [sys.executable, "-c", "import tiny.ir.config"], env=env, capture_output=True, text=True, timeout=60
    )
    assert run.returncode != 0, run.stdout + run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError") and f"{name}={text!r}: expected int" in last, run.stderr


def test_context_refuses_a_value_of_the_wrong_type() -> None:
    with pytest.raises(TypeError, match="Context\\(BEAM='lots'\\): flag BEAM takes a value of type int, got str"):
        with Context(BEAM="lots"):
            pass
    with pytest.raises(TypeError, match="CACHEDB.*str, got int"):
        with Context(CACHEDB=3):
            pass
    assert not FLAGS["BEAM"]._override and not FLAGS["CACHEDB"]._override


def test_a_flag_parses_the_environment_once_per_change(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags are read on every op: a read that finds the value it parsed last does not parse it again."""
    parsed: list[str] = []

    def counted(raw: str) -> int:
        parsed.append(raw)
        return int(raw)

    flag = Flag("TINY_TEST_COUNTED", counted, 0, "a flag of this test")  # type: ignore[arg-type]
    monkeypatch.setenv("TINY_TEST_COUNTED", "2")
    assert [flag.value for _ in range(3)] == [2, 2, 2] and parsed == ["2"]
    monkeypatch.setenv("TINY_TEST_COUNTED", "5")
    assert flag.value == 5 and flag.value == 5 and parsed == ["2", "5"]
    monkeypatch.delenv("TINY_TEST_COUNTED")
    assert flag.value == 0 and parsed == ["2", "5"]
    with Context(DEBUG=1):
        assert DEBUG.value == 1


def test_a_flag_keeps_its_value_until_the_environment_or_an_override_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    """Flags are read on every op: a read is a plain attribute (the parsed value in the flag's __dict__), forgotten by
    every way os.environ is written (set, update, setdefault, pop, del) and by Context."""
    monkeypatch.setenv("DEBUG", "1")
    assert DEBUG.value == 1 and vars(DEBUG)["value"] == 1
    writes = [
        lambda: os.environ.update(DEBUG="2"),
        lambda: os.environ.pop("DEBUG"),
        lambda: os.environ.setdefault("DEBUG", "3"),
        lambda: os.environ.__delitem__("DEBUG"),
        lambda: os.environ.__setitem__("DEBUG", "4"),
    ]
    for write, expected in zip(writes, (2, 0, 3, 0, 4)):
        write()
        assert "value" not in vars(DEBUG) and DEBUG.value == expected and vars(DEBUG)["value"] == expected
    os.environ["DEBUG"] = "not a number"  # (refused where it is read, as before the value was kept)
    with pytest.raises(ValueError, match="DEBUG='not a number': expected int"):
        _ = DEBUG.value
    os.environ["DEBUG"] = "5"
    with Context(DEBUG=6):
        assert DEBUG.value == 6
    assert DEBUG.value == 5


def test_every_flag_is_declared_with_type_default_and_doc() -> None:
    for name, flag in FLAGS.items():
        assert flag.name == name and name.isupper()
        assert flag.type in (int, str) and isinstance(flag.default, flag.type)
        assert len(flag.doc) > 10


def test_context_overrides_and_restores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBUG", raising=False)
    monkeypatch.setenv("CACHELEVEL", "1")
    assert CACHELEVEL.value == 1 and DEBUG.value == 0
    with Context(DEBUG=4, CACHELEVEL=0):
        assert DEBUG.value == 4 and CACHELEVEL.value == 0
        with Context(DEBUG=5):
            assert DEBUG.value == 5 and CACHELEVEL.value == 0
        assert DEBUG.value == 4
    assert DEBUG.value == 0 and CACHELEVEL.value == 1
    monkeypatch.delenv("CACHELEVEL")
    with pytest.raises(RuntimeError):
        with Context(CACHELEVEL=0):
            assert CACHELEVEL.value == 0
            raise RuntimeError("inside")
    assert CACHELEVEL.value == 2


def test_context_rejects_unknown_flags() -> None:
    with pytest.raises(KeyError, match="unknown flag.*NOT_A_FLAG"):
        with Context(NOT_A_FLAG=1):
            pass


def test_context_with_an_unknown_flag_leaves_no_override_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DEBUG", raising=False)
    with pytest.raises(KeyError):
        with Context(DEBUG=3, NOT_A_FLAG=1):
            pass
    leaked = DEBUG.value
    DEBUG._override.clear()  # undo the leak, so the rest of the session is unaffected
    assert leaked == 0
