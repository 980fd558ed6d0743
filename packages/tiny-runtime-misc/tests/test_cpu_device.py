"""The CPU device: finding a C compiler, compiling and running hand-written C kernels, its allocator, its errors,
and how it shows up through entry points and `python -m tiny.ir.device`. Skips where no C compiler is on PATH."""

from __future__ import annotations

import ctypes
import gc
import os
import shutil
import stat
import subprocess
import sys
import threading
import weakref
from collections.abc import Iterator
from pathlib import Path

import pytest

from tiny.ir.config import Context
from tiny.ir.device import (
    LAUNCHERS,
    Buffer,
    CompiledProgram,
    CompileError,
    Device,
    DeviceUnavailable,
    UnknownDevice,
    available,
    renderer_entry_points,
)
from tiny.ir.dtypes import dtypes
from tiny.runtime import cpu
from tiny.runtime.cpu import ALIGN, ClangCompiler, CPUAllocator, CPUDevice, CPUProgram, find_clang, find_compiler
from tiny.runtime.cpu_queue import Queue, meet

ADD_KERNEL = """
void add(float* restrict out, const float* restrict a, const float* restrict b, int n) {
  for (int i = 0; i < n; i++) out[i] = a[i] + b[i];
}
"""


def has_cc() -> bool:
    return bool(shutil.which("clang") or shutil.which("gcc") or any(shutil.which(f"clang-{v}") for v in range(10, 30)))


needs_cc = pytest.mark.skipif(not has_cc(), reason="no C compiler (clang or gcc) on PATH")


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test compiles into a cache of its own, and finds the compiler afresh."""
    monkeypatch.setenv("CACHEDB", str(tmp_path / "cache.db"))
    monkeypatch.delenv("CC", raising=False)
    find_compiler.cache_clear()
    find_clang.cache_clear()
    yield
    find_compiler.cache_clear()
    find_clang.cache_clear()


def fake_tools(directory: Path, *names: str, executable: bool = True) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name in names:
        tool = directory / name
        tool.write_text("#!/bin/sh\nexit 0\n")
        tool.chmod(stat.S_IRWXU if executable else stat.S_IRUSR | stat.S_IWUSR)
    return directory


# ---------------------------------------------------------------- finding a compiler


def test_no_compiler_on_path_names_both(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(DeviceUnavailable) as info:
        find_compiler()
    assert "clang" in str(info.value) and "gcc" in str(info.value)


def test_the_newest_clang_is_preferred(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = fake_tools(tmp_path / "bin", "clang", "clang-13", "clang-17", "gcc", "clang-format-19", "clang++-20")
    monkeypatch.setenv("PATH", str(tools))
    assert find_compiler() == "clang-17"


def test_gcc_when_there_is_no_clang(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_tools(tmp_path / "bin", "gcc", "clang-format")))
    assert find_compiler() == "gcc"


def test_a_clang_that_cannot_run_is_not_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = fake_tools(tmp_path / "bin", "clang-15", "gcc")
    fake_tools(tools, "clang-99", executable=False)
    monkeypatch.setenv("PATH", str(tools))
    assert find_compiler() == "clang-15"


def test_cc_is_respected(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tools = fake_tools(tmp_path / "bin", "clang-18", "mycc")
    monkeypatch.setenv("PATH", str(tools))
    monkeypatch.setenv("CC", "mycc")
    assert find_compiler() == "mycc"
    monkeypatch.setenv("CC", "no-such-cc")
    find_compiler.cache_clear()
    with pytest.raises(DeviceUnavailable, match="no-such-cc"):
        find_compiler()
    monkeypatch.delenv("CC")
    find_compiler.cache_clear()
    with Context(CC="mycc"):
        assert find_compiler() == "mycc"


# ---------------------------------------------------------------- which path `CPU` takes


@pytest.mark.parametrize(
    ("tools", "cc", "llvmlite", "expected"),
    [
        (("clang-19", "gcc"), "", True, "C"),  # clang: C, as fast as LLVM and compiled beside the process
        (("gcc",), "", True, "LLVM"),  # gcc's vector code is slower than LLVM's: in-process LLVM
        (("gcc",), "", False, "C"),  # no llvmlite: gcc it is
        ((), "", True, "LLVM"),  # no compiler at all
        ((), "", False, "C"),  # nothing: C, whose opening says what to install
        (("gcc",), "gcc", True, "C"),  # CC names the compiler: C through it
    ],
)
def test_the_default_renderer_is_the_fastest_path_here(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    tools: tuple[str, ...],
    cc: str,
    llvmlite: bool,
    expected: str,
) -> None:
    monkeypatch.setenv("PATH", str(fake_tools(tmp_path / "bin", *tools)))
    monkeypatch.setattr(cpu, "llvmlite_present", lambda: llvmlite)
    with Context(CC=cc):
        assert CPUDevice.default_renderer() == expected


def test_no_compiler_and_no_llvmlite_says_both_ways_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(fake_tools(tmp_path / "bin")))
    monkeypatch.setattr(cpu, "llvmlite_present", lambda: False)
    with pytest.raises(DeviceUnavailable) as info:
        CPUDevice("CPU", CPUDevice.default_renderer())
    assert "apt install clang" in str(info.value) and "pip install llvmlite" in str(info.value)


@pytest.mark.skipif(not cpu.llvmlite_present(), reason="llvmlite is not installed")
def test_without_clang_cpu_is_llvm_and_says_so(tmp_path: Path) -> None:
    """A machine with gcc but no clang (PATH holds only gcc): `CPU` opens with LLVM, `CPU:LLVM` is the same
    device, `CPU:C` is gcc; `python -m tiny.ir.device` and DEBUG=1 name the compiler of each."""
    if shutil.which("gcc") is None:
        pytest.skip("no gcc on PATH")
    tools = tmp_path / "bin"
    tools.mkdir()
    for name in ("gcc", "as", "ld"):
        if (found := shutil.which(name)) is not None:
            (tools / name).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "CC")} | {"PATH": str(tools), "DEBUG": "1"}
    code = (
        "from tiny.ir.device import Device; import numpy as np\n"
        "from tiny.ir.device import Buffer\n"
        "print(Device.canonicalize('CPU:LLVM'), Device.canonicalize('CPU:C'), Device['CPU'].renderer_name)\n"
        "print(Device['CPU:C'].describe())\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "CPU CPU:C LLVM" in lines
    assert any(line.startswith("opened device CPU with renderer LLVM (llvmlite ") for line in lines), lines
    assert any(line.startswith("gcc: ") for line in lines), lines
    r = subprocess.run([sys.executable, "-m", "tiny.ir.device"], capture_output=True, text=True, env=env, timeout=120)
    cpu_row = next(line for line in r.stdout.splitlines() if line.split()[:1] == ["CPU"])
    assert "renderer LLVM (llvmlite" in cpu_row and "in-process" in cpu_row and cpu_row.endswith("also CPU:C")


def test_a_device_that_cannot_open_names_itself_and_the_listing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """DEVICE=CUDA on a machine without a driver, or CPU:C without a compiler: the error names the device and points
    to `python -m tiny.ir.device`; the listing itself gives the bare reason."""
    monkeypatch.setenv("PATH", str(fake_tools(tmp_path / "bin")))
    with pytest.raises(DeviceUnavailable) as info:
        Device["CPU:5:C"]
    message = str(info.value)
    name = Device.canonicalize("CPU:5:C")  # CPU:5 where C is the default renderer
    assert message.startswith(f"{name}: CPU:C needs a C compiler") and "`python -m tiny.ir.device` lists" in message


@pytest.mark.skipif(shutil.which("gcc") is None, reason="no gcc on PATH")
def test_a_second_cpu_device_takes_its_own_compiler() -> None:
    dev = Device["CPU:7:C"]
    dev.set_compiler("gcc")
    assert dev.cc == "gcc" and "gcc" in dev._compiler.cachekey and dev.describe().startswith("gcc: ")
    binary = dev.compile(ADD_KERNEL)
    assert binary and Device["CPU:C"].cc == find_compiler()  # the other CPU device keeps its own
    with pytest.raises(DeviceUnavailable, match="no-such-cc"):
        dev.set_compiler("no-such-cc")
    if cpu.llvmlite_present():
        with pytest.raises(ValueError, match="renders LLVM"):
            Device["CPU:LLVM"].set_compiler("gcc")


# ---------------------------------------------------------------- compiling and running


@needs_cc
def test_compile_and_run_a_hand_written_kernel() -> None:
    binary = ClangCompiler(find_compiler()).compile(ADD_KERNEL)
    assert isinstance(binary, bytes) and len(binary) > 100
    if sys.platform.startswith("linux"):
        assert binary[:4] == b"\x7fELF"
    prog = CPUProgram(Device["CPU"], "add", binary)
    alloc = CPUAllocator(Device["CPU"].queue)  # (its copies wait for the device's launches)
    bufs = [alloc.alloc(16) for _ in range(3)]
    alloc.copyin(bufs[1], memoryview(bytearray((ctypes.c_float * 4)(1, 2, 3, 4))))
    alloc.copyin(bufs[2], memoryview(bytearray((ctypes.c_float * 4)(10, 20, 30, 40))))
    assert prog(*bufs, vals=(3,)) is None
    out = (ctypes.c_float * 4)()
    alloc.copyout(memoryview(out).cast("B"), bufs[0])
    assert list(out) == [11.0, 22.0, 33.0, 0.0]  # n=3: the last element untouched (allocations start zeroed)
    elapsed = prog(*bufs, vals=(4,), wait=True)
    assert isinstance(elapsed, float) and elapsed >= 0
    alloc.copyout(memoryview(out).cast("B"), bufs[0])
    assert list(out) == [11.0, 22.0, 33.0, 44.0]


HALF_KERNEL = """
void fma_half(_Float16* restrict out, const _Float16* a, const _Float16* b, const _Float16* c) {
  for (int i = 0; i < 4096; i++) out[i] = a[i] * b[i] + c[i];
}
"""


@needs_cc
def test_half_arithmetic_rounds_where_it_is_stored_on_every_host() -> None:
    """A kernel's _Float16 expression is computed in float32 and rounded once, where it is stored, as on an x86
    without half arithmetic; not rounded after every op where the host has it (AVX512-FP16: cpu.NO_NATIVE_HALF)."""
    np = pytest.importorskip("numpy")
    cc = find_compiler()
    if "f16" not in cpu.compiler_features(cc):
        pytest.skip(f"{cc} has no _Float16")
    rng = np.random.default_rng(0)
    a, b, c = (rng.standard_normal(4096).astype(np.float16) for _ in range(3))
    prog = CPUProgram(Device["CPU"], "fma_half", ClangCompiler(cc).compile(HALF_KERNEL))
    alloc = CPUAllocator(Device["CPU"].queue)
    bufs = [alloc.alloc(2 * 4096) for _ in range(4)]
    for buf, x in zip(bufs[1:], (a, b, c)):
        alloc.copyin(buf, memoryview(x.tobytes()))
    prog(*bufs, wait=True)
    out = np.empty(4096, np.float16)
    alloc.copyout(memoryview(out).cast("B"), bufs[0])
    once = (a.astype(np.float32) * b.astype(np.float32) + c.astype(np.float32)).astype(np.float16)
    each = (a * b + c).astype(np.float16)  # (numpy rounds every op to half)
    assert (once != each).any()  # (the test tells the two apart)
    np.testing.assert_array_equal(out, once)


def test_the_hosts_vendor_picks_how_prefetches_treat_their_lines() -> None:
    """AMD's CPUs read streams fastest prefetched non-temporally (0), others (an Intel Xeon: a third of the speed so)
    into every cache level (3); the device's renderers take the host's from its target, C and LLVM IR alike."""
    amd = "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\n"
    intel = "processor\t: 0\nvendor_id\t: GenuineIntel\ncpu family\t: 6\n"
    assert cpu.locality_for(amd) == 0 and cpu.locality_for(amd.replace("AuthenticAMD", "HygonGenuine")) == 0
    assert cpu.locality_for(intel) == 3 and cpu.locality_for("") == 3  # (an Arm host's cpuinfo names no vendor_id)
    for name in ("CPU", "CPU:LLVM"):
        try:
            dev = Device[name]
        except DeviceUnavailable:
            continue
        assert f"prefetch_locality={cpu.prefetch_locality()};" in dev.renderer_target()
        assert dev.renderer.prefetch_locality == cpu.prefetch_locality()


@needs_cc
def test_the_launcher_is_the_declared_function_and_keeps_its_signature() -> None:
    scale = "void scale(float* restrict out, const float* a) { for (int i = 0; i < 4; i++) out[i] = 2 * a[i]; }"
    dev = Device["CPU"]
    prog = CPUProgram(dev, "scale", dev.compile(scale))
    alloc = CPUAllocator(Device["CPU"].queue)  # (its copies wait for the device's launches)
    out, a = alloc.alloc(16), alloc.alloc(16)
    alloc.copyin(a, memoryview(bytearray((ctypes.c_float * 4)(1, 2, 3, 4))))
    launch = prog.launcher(2, (1, 1, 1), (1, 1, 1))  # the device's queue given the ctypes function and the opaques
    declared = prog.function(2, 0, False)
    prog(out, a, vals=(7,), wait=True)  # another signature declared (an int more) leaves the launcher's alone
    assert prog.function(2, 1, False) is not declared and len(declared.argtypes) == 2
    alloc.copyin(out, memoryview(bytearray(16)))
    assert launch(out, a) is None
    got = (ctypes.c_float * 4)()
    alloc.copyout(memoryview(got).cast("B"), out)
    assert list(got) == [2.0, 4.0, 6.0, 8.0]
    threaded = prog.launcher(2, (2, 1, 1), (1, 1, 1))  # more than one thread: the pool's call, as __call__ runs it
    assert threaded is not launch
    alloc.copyin(out, memoryview(bytearray(16)))
    assert threaded(out, a) is None  # (each thread's call runs the whole of this kernel, which has no thread number)
    alloc.copyout(memoryview(got).cast("B"), out)
    assert list(got) == [2.0, 4.0, 6.0, 8.0]


@needs_cc
def test_a_launcher_takes_the_kernels_variables_after_its_buffers() -> None:
    """Program.launcher's n_vals (interface 1.13): a kernel over a Variable launched as launch(*opaques, *values), on
    one thread (the ctypes function declared with its int) and on the pool (each part's number after it)."""
    dev = Device["CPU"]
    one = "void one(float* out, int n) { for (int i = 0; i < n; i++) out[i] = n; }"
    parts = "void parts(float* out, int n, int part) { for (int i = 0; i < n; i++) out[part * 4 + i] = part * 10 + n; }"
    alloc = CPUAllocator(dev.queue)
    got = (ctypes.c_float * 8)()
    for src, threads, want in ((one, 1, [3, 3, 3, 0, 0, 0, 0, 0]), (parts, 2, [3, 3, 3, 0, 13, 13, 13, 0])):
        name = src.split("(")[0].split()[-1]
        out = alloc.alloc(32)
        CPUProgram(dev, name, dev.compile(src)).launcher(1, (threads, 1, 1), (1, 1, 1), n_vals=1)(out, 3)
        alloc.copyout(memoryview(got).cast("B"), out)
        assert list(got) == want, (name, list(got))


@needs_cc
def test_a_threaded_launcher_finds_the_pool_once_and_a_forked_child_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    """A threaded kernel's launcher is the pool's call itself, the pool found when the launcher is made: a launch looks
    nothing up (a decode step's few hundred launches each spent about 2 us on the device's share of the cores and its
    pool). In a forked child, which has none of the pool's threads, launchers given before are stale and the new ones
    find the child's own pool."""
    dev = Device["CPU"]
    src = "void fill(float* out, int part) { for (int i = 0; i < 4; i++) out[part * 4 + i] = part + 1; }"
    prog = CPUProgram(dev, "fill", dev.compile(src))
    alloc = CPUAllocator(dev.queue)
    out, got = alloc.alloc(32), (ctypes.c_float * 8)()
    monkeypatch.setattr(cpu, "share", lambda: 2)
    launch = prog.launcher(1, (2, 1, 1), (1, 1, 1))

    def asked(*args: object) -> None:
        raise AssertionError("a launch looked up the device's threads or pool")

    monkeypatch.setattr(cpu, "share", asked)
    monkeypatch.setattr(cpu, "_pool", asked)
    launch(out)
    alloc.copyout(memoryview(got).cast("B"), out)
    assert list(got) == [1.0] * 4 + [2.0] * 4
    monkeypatch.undo()
    if not hasattr(os, "fork"):
        return
    epoch = LAUNCHERS.epoch
    read, write = os.pipe()
    if (pid := os.fork()) == 0:  # the child: its launchers are asked for again
        os.write(write, b"1" if LAUNCHERS.epoch != epoch else b"0")
        os._exit(0)
    os.waitpid(pid, 0)
    assert os.read(read, 1) == b"1" and LAUNCHERS.epoch == epoch


@needs_cc
def test_a_threaded_launch_on_python_threads_runs_its_first_part_on_the_calling_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where there is no pool in C (no C compiler beside CPU:LLVM, another calling convention), a kernel's parts go to
    Python threads; the launching thread would only wait for them: it runs part 0 itself and the workers the others,
    so a launch wakes one worker fewer."""
    dev = Device["CPU"]
    prog = CPUProgram(dev, "scale", dev.compile("void scale(float* out, int part) { out[part] = part; }"))
    ran: dict[int, int] = {}
    monkeypatch.setattr(
        prog, "function", lambda *signature: lambda *args: ran.setdefault(args[-1], threading.get_ident())
    )
    monkeypatch.setattr(cpu, "share", lambda: 2)
    monkeypatch.setattr(cpu, "_pool", lambda *key: None)
    prog.run((0,), 4)
    assert sorted(ran) == [0, 1, 2, 3]
    me = threading.get_ident()
    assert ran[0] == me and all(ran[t] != me for t in (1, 2, 3))


@needs_cc
def test_two_programs_of_one_name_stay_apart() -> None:
    dev = Device["CPU"]
    one = CPUProgram(dev, "k", dev.compile("int k(void) { return 1; }"))
    two = CPUProgram(dev, "k", dev.compile("int k(void) { return 2; }"))
    one.fn.restype = two.fn.restype = ctypes.c_int
    assert (one.fn(), two.fn()) == (1, 2)


def _mapped(marker: str) -> int:
    with open("/proc/self/maps") as f:
        return sum(marker in line for line in f)


@needs_cc
@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="no /proc/self/maps to read the mappings from")
def test_a_program_no_longer_held_is_unloaded() -> None:
    """A process builds many thousand kernels (the autograd fuzz: 13000); each library loaded stays mapped (5 maps)
    until it is unloaded, and at vm.max_map_count (65530) every later load failed. The library goes with the last of
    the program and its ctypes functions, which a caller may hold on its own (a jitted function's launchers)."""
    dev = Device["CPU"]
    prog = CPUProgram(dev, "unload_me_k", dev.compile("int unload_me_k(void) { return 7; }"))
    fn = prog.function(0, 0, False)
    fn.restype = ctypes.c_int
    assert _mapped("tiny_unload_me_k_") > 0
    del prog
    gc.collect()
    assert _mapped("tiny_unload_me_k_") > 0 and fn() == 7  # the function held keeps it
    del fn
    gc.collect()
    assert _mapped("tiny_unload_me_k_") == 0


def _kernel(name: str, value: int) -> str:
    """A kernel with a static helper of the same name in every source (each source keeps its own)."""
    helper = f"static inline int helper(void) {{ return {value}; }}\n"
    return helper + f"void {name}(int* restrict out) {{ out[0] = helper(); }}\n"


@needs_cc
def test_kernels_compiled_together_keep_their_names_and_helpers() -> None:
    """compile_many takes sources in one compiler run per library of different names: a kernel of a name already in
    the library goes to another; each source's binary exports its kernel, which computes its own helper's value."""
    from tiny.runtime.cpu import _libraries

    srcs = [_kernel("a", 1), _kernel("b", 2), _kernel("a", 3), _kernel("c", 4)]
    assert _libraries(srcs) == [[0, 1, 3], [2]]
    assert _libraries([_kernel(f"k{i}", i) for i in range(20)]) == [list(range(16)), list(range(16, 20))]
    binaries = ClangCompiler(find_compiler()).compile_many(srcs)
    assert binaries[0] == binaries[1] == binaries[3] != binaries[2]
    alloc = CPUAllocator(Device["CPU"].queue)  # (its copies wait for the device's launches)
    for src, binary, name, want in zip(srcs, binaries, "abac", (1, 2, 3, 4)):
        prog = CPUProgram(Device["CPU"], name, binary)
        out = alloc.alloc(16)
        prog(out)
        got = (ctypes.c_int * 4)()
        alloc.copyout(memoryview(got).cast("B"), out)
        assert got[0] == want, (src, got[0])


@needs_cc
def test_a_compile_error_among_kernels_compiled_together_names_its_source() -> None:
    bad = "void broken(float* out) { out[0] = undefined_name; }"
    with pytest.raises(CompileError) as info:
        ClangCompiler(find_compiler()).compile_many([_kernel("a", 1), bad, _kernel("b", 2)])
    assert bad in str(info.value) and "helper" not in str(info.value)


@needs_cc
def test_a_compile_error_carries_the_source() -> None:
    src = "void broken(float* out) { out[0] = undefined_name; }"
    with pytest.raises(CompileError) as info:
        ClangCompiler(find_compiler()).compile(src)
    assert src in str(info.value) and "undefined_name" in str(info.value)
    with pytest.raises(CompileError):
        Device["CPU"].compile(src)  # through the disk cache too: a failure is not cached as a binary


@needs_cc
def test_the_compile_cache_key_names_the_compiler() -> None:
    c = ClangCompiler(find_compiler())
    assert c.cachekey is not None and c.cachekey.startswith("cpu:") and find_compiler() in c.cachekey


@needs_cc
def test_the_compile_cache_key_names_the_flags() -> None:
    """A binary compiled with -ffp-contract=fast (before) must not be taken for one compiled without contraction: the
    same source, but a value rounded differently in one kernel than in another."""
    key = ClangCompiler(find_compiler()).cachekey
    assert key is not None and "-ffp-contract=off" in key and "-O2" in key


@needs_cc
def test_compile_cached_uses_the_disk(tmp_path: Path) -> None:
    calls = []

    class Counting(ClangCompiler):
        def compile(self, src: str) -> bytes:
            calls.append(src)
            return super().compile(src)

    src = "int seven(void) { return 7; }"
    first = Counting(find_compiler()).compile_cached(src)
    again = Counting(find_compiler()).compile_cached(src)
    assert first == again and len(calls) == 1
    assert (tmp_path / "cache.db").exists()


# ---------------------------------------------------------------- memory


def test_allocator_alignment_and_caps() -> None:
    alloc = CPUAllocator(Device["CPU"].queue)  # (its copies wait for the device's launches)
    assert alloc.caps.host_visible and alloc.caps.aligned == ALIGN >= 16
    for size in (1, 3, 16, 1000, 4097):
        opaque = alloc.alloc(size)
        assert isinstance(opaque, int) and opaque % ALIGN == 0


def test_a_big_allocation_is_a_mapping_of_its_own_in_huge_pages() -> None:
    """An allocation of HUGE_FROM bytes or more is a mapping of its own that the system may back with transparent huge
    pages (a model's weights: fewer TLB misses); smaller ones come from the allocator as before."""
    thp = Path("/sys/kernel/mm/transparent_hugepage/enabled")
    if not cpu.HUGE_PAGES or not thp.exists() or "[never]" in thp.read_text():
        pytest.skip("no transparent huge pages on this system")
    alloc = CPUAllocator(Device["CPU"].queue)
    big, small = alloc.alloc(cpu.HUGE_FROM * 3), alloc.alloc(4096)
    assert big % ALIGN == 0
    alloc.copyin(big, memoryview(b"x" * 64))
    assert bytes(alloc.as_memoryview(big, 2)) == b"xx"

    def advised(address: int) -> bool:  # the mapping holding an address, as /proc/self/smaps says of it
        mapping = ""
        for line in Path("/proc/self/smaps").read_text().splitlines():
            if "-" in line.split(" ")[0] and ":" not in line.split(" ")[0]:
                lo, hi = (int(x, 16) for x in line.split(" ")[0].split("-"))
                mapping = "here" if lo <= address < hi else ""
            elif mapping and line.startswith("VmFlags:"):
                return " hg" in line
        raise AssertionError(f"no mapping holds {address:#x}")

    assert advised(big) and not advised(small)
    alloc.free(big, cpu.HUGE_FROM * 3)


def test_an_allocation_the_host_cannot_hold_says_what_was_asked_and_what_there_is() -> None:
    """The MemoryError was empty: it names the bytes asked for, the device, and the host's memory."""
    n = 2**50  # 1 PiB: more than any host has
    with pytest.raises(MemoryError) as e:
        Buffer("CPU", n, dtypes.uint8).ensure_allocated()
    msg = str(e.value)
    assert msg.startswith(f"CPU cannot allocate {n} bytes") and f"{n} uint8 values" in msg, msg
    free, total = CPUAllocator().memory() or (None, None)
    assert total is not None and 0 < free <= total and f"free of {total} bytes" in msg, msg
    tensor = pytest.importorskip("tiny.tensor")
    with pytest.raises(MemoryError, match=f"CPU cannot allocate {4 * n} bytes .* for {n} float32 values: it has"):
        tensor.Tensor.empty(n, device="CPU").contiguous().realize()


def test_allocator_copies_and_views() -> None:
    alloc = CPUAllocator(Device["CPU"].queue)  # (its copies wait for the device's launches)
    buf = alloc.alloc(8)
    alloc.copyin(buf, memoryview(b"abcdefgh"))
    out = bytearray(8)
    alloc.copyout(memoryview(out), buf)
    assert out == b"abcdefgh"
    view = alloc.as_memoryview(buf, 8)
    assert view.format == "B" and view.nbytes == 8 and bytes(view) == b"abcdefgh"
    view[0:2] = b"XY"  # the view is the memory itself
    alloc.copyout(memoryview(out), buf)
    assert out == b"XYcdefgh"
    alloc.copyin(buf, memoryview(b"1234"))  # a shorter copy writes the front only
    assert bytes(alloc.as_memoryview(buf, 8)) == b"1234efgh"


def test_allocator_reuses_freed_memory() -> None:
    alloc = CPUAllocator(Device["CPU"].queue)  # (its copies wait for the device's launches)
    a = alloc.alloc(64)
    alloc.free(a, 64)
    assert alloc.alloc(64) == a
    assert alloc.alloc(64) != a


@needs_cc
def test_buffers_on_the_cpu() -> None:
    buf = Buffer("CPU", 4, dtypes.int32)
    assert not buf.is_allocated
    data = (ctypes.c_int32 * 4)(1, -2, 3, 2**31 - 1)
    buf.copyin(memoryview(data))
    assert buf.is_allocated and buf.as_bytes() == bytes(data)
    other = Buffer("CPU", 4, dtypes.int32)
    other.copy_from(buf)
    assert other.as_bytes() == bytes(data)
    empty = Buffer("CPU", 0, dtypes.float32)
    assert empty.as_bytes() == b""


# ---------------------------------------------------------------- the device through entry points


@needs_cc
def test_device_cpu_through_entry_points() -> None:
    dev = Device["CPU"]
    assert isinstance(dev, CPUDevice) and dev.name == "CPU"
    assert Device["cpu"] is dev and Device["CPU:0"] is dev
    assert dev.renderer_name == CPUDevice.default_renderer()
    dev = Device["CPU:C"]  # the default where clang is here; LLVM's own tests are in test_cpu_llvm.py
    if "C" in renderer_entry_points():  # the C renderer comes with tiny-codegen, which this package does not need
        assert dev.renderer.caps.language == "C"
        assert dtypes.float32 in dev.renderer.caps.dtypes and dev.renderer.caps.vector_width in (4, 8, 16)
    assert isinstance(dev.allocator, CPUAllocator)
    with pytest.raises(UnknownDevice, match="takes the renderers"):
        Device["CPU:PTX"]
    prog = CompiledProgram("seven", "CPU", "C", "int seven(void) { return 7; }", b"", 0, (), ())
    binary = dev.compile(prog.src)
    loaded = dev.load(CompiledProgram("seven", "CPU", "C", prog.src, binary, 0, (), ()))
    assert isinstance(loaded, CPUProgram)
    assert dev.load(CompiledProgram("seven", "CPU", "C", prog.src, binary, 0, (), ())) is loaded  # cached
    status = {s.name: s for s in available()}
    assert status["CPU"].ok and "CPUDevice" in status["CPU"].reason and status["CPU"].renderers == ("C", "LLVM")


@needs_cc
def test_naming_the_default_renderer_gives_the_same_device() -> None:
    default = CPUDevice.default_renderer()
    assert Device.canonicalize(f"CPU:{default}") == "CPU"
    assert Device[f"CPU:{default}"] is Device["CPU"]


def test_python_m_tiny_ir_device_lists_the_devices() -> None:
    env = {k: v for k, v in os.environ.items() if k != "DEVICE"}
    r = subprocess.run([sys.executable, "-m", "tiny.ir.device"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("tiny device interface ")
    rows = {line.split()[0]: line.split(maxsplit=2)[1:] for line in lines[1:] if line.startswith("  ")}
    assert "CPU" in rows and "NULL" in rows
    for name, (answer, *reason) in rows.items():
        assert answer in ("yes", "no"), name
        assert reason, f"{name} says {answer} without saying why"
    assert rows["NULL"][0] == "yes"
    assert rows["CPU"][0] == ("yes" if has_cc() else "no")
    if not has_cc() and not cpu.llvmlite_present():
        assert "clang" in rows["CPU"][1] and "gcc" in rows["CPU"][1]
    if "PYTHON" in rows:
        assert rows["PYTHON"][0] in ("yes", "no")
    assert lines[-1].startswith("default device: ")
    if has_cc() or cpu.llvmlite_present():
        assert lines[-1] == "default device: CPU"


def test_python_m_tiny_ir_device_without_a_compiler(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("DEVICE", "CC")} | {"PATH": str(empty)}
    r = subprocess.run([sys.executable, "-m", "tiny.ir.device"], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    (row,) = [line for line in r.stdout.splitlines() if line.split()[:1] == ["CPU"]]
    if cpu.llvmlite_present():  # no compiler is needed: LLVM in-process
        assert row.split()[1] == "yes" and "renderer LLVM" in row and "default device: CPU" in r.stdout
    else:
        assert row.split()[1] == "no" and "clang" in row and "gcc" in row
        assert "default device: CPU" not in r.stdout


def test_the_cpu_flags_are_declared_here_and_fail_at_import_when_they_do_not_parse() -> None:
    """THREADS and CC belong to this runtime (tiny.ir.config.flag in tiny.runtime.cpu); a THREADS that does not
    parse fails when the runtime is imported, naming the flag, its type and the value."""
    from tiny.ir.config import FLAGS

    assert FLAGS["THREADS"] is cpu.THREADS and FLAGS["CC"] is cpu.CC
    env = os.environ | {"THREADS": "four", "PYTHONPATH": os.pathsep.join(sys.path)}
    run = subprocess.run([sys.executable, "-c", "import tiny.runtime.cpu"], env=env, capture_output=True, text=True)
    assert run.returncode != 0
    assert run.stderr.strip().splitlines()[-1].startswith("ValueError: environment flag THREADS='four': expected int")


def test_a_queue_runs_in_order_meets_others_and_says_what_failed() -> None:
    """A CPU device's queue (on a thread of its own, as with several CPU devices open) runs its launches in order; a
    meeting of two queues runs after what each was given before and before what each is given after; a launch that
    fails is raised, once, by the next synchronize."""
    a, b = Queue("A", lambda: True), Queue("B", lambda: True)
    seen: list[object] = []
    for i in range(50):
        a.submit(seen.append, i)
    meet([a, b], seen.append, "met")
    b.submit(seen.append, "after")
    a.synchronize()
    b.synchronize()
    assert seen == [*range(50), "met", "after"]
    a.submit(int, "not a number")
    with pytest.raises(RuntimeError, match="a launch on A failed: invalid literal"):
        a.synchronize()
    a.synchronize()  # (said once)


def test_a_device_that_cannot_start_keeps_nothing_of_its_caller() -> None:
    """The error of a device that cannot start is no reference cycle: one kept its caller's frames, and their arrays,
    until the cycle collector ran (the first tensor of a model's file, 36 MB, while the rest was read)."""

    class Payload:
        pass

    def caller() -> weakref.ref:
        payload = Payload()
        try:
            with Context(CC="no-such-compiler-here"):
                Device["CPU:7"]
        except DeviceUnavailable as e:
            assert "no-such-compiler-here" in str(e)
        return weakref.ref(payload)

    gc.collect()
    gc.disable()
    try:
        assert caller()() is None
    finally:
        gc.enable()


def test_a_compilers_features_are_probed_once_per_compiler_and_host(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A process's start does not wait for the feature probes again: their answer is kept in the disk cache under the
    compiler's file, probed again for another file or a changed one, and every time without a disk cache."""
    real = shutil.which(find_compiler())
    assert real is not None
    wrapper = tmp_path / "bin" / "tiny-test-cc"
    wrapper.parent.mkdir()
    wrapper.write_text(f'#!/bin/sh\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{wrapper.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CACHEDB", str(tmp_path / "cache.db"))
    probed: list[str] = []
    probe = cpu._probed_features
    monkeypatch.setattr(cpu, "_probed_features", lambda cc: probed.append(cc) or probe(cc))

    def in_a_new_process(cc: str) -> frozenset[str]:
        cpu.compiler_features.cache_clear()
        return cpu.compiler_features(cc)

    try:
        with Context(CACHELEVEL=2):
            first = in_a_new_process(real)
            assert first == probe(real) and in_a_new_process(real) == first and probed == [real]
            assert in_a_new_process(str(wrapper)) == first and probed == [real, str(wrapper)]
            os.utime(wrapper, ns=(wrapper.stat().st_atime_ns, wrapper.stat().st_mtime_ns + 10**9))
            assert in_a_new_process(str(wrapper)) == first and len(probed) == 3
        with Context(CACHELEVEL=0):
            in_a_new_process(real), in_a_new_process(real)
            assert len(probed) == 5
    finally:
        cpu.compiler_features.cache_clear()


def test_a_compiler_that_stops_before_reading_a_probe_has_none_of_its_features(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """A probe's source goes to the compiler through a pipe; one that exits without reading it (a wrapper refusing
    its flags) fails that probe, not the device's start with a BrokenPipeError. (A source past the pipe's buffer:
    the write waits for the reader, which is gone.)"""
    quitter = tmp_path / "tiny-test-quitter"
    quitter.write_text("#!/bin/sh\nexit 1\n")
    quitter.chmod(0o755)
    big = {name: (flags, src + "\n" + "/* padding */\n" * 100_000) for name, (flags, src) in cpu.FEATURE_PROBES.items()}
    monkeypatch.setattr(cpu, "FEATURE_PROBES", big)
    assert cpu._probed_features(str(quitter)) == frozenset()
