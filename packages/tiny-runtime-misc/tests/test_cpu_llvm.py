"""CPU:LLVM: the CPU device with the LLVM renderer, compiling LLVM IR in-process with llvmlite. It opens without a
C compiler, says what to install when llvmlite is missing, keys its compile cache by LLVM version and host CPU,
and runs kernels through the same thread pool and argument passing as the C path. Skips where llvmlite is absent."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tiny.ir.device import CompiledProgram, CompileError, Device, DeviceUnavailable, available, renderer_entry_points
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops, UOp
from tiny.runtime import llvm as llvm_runtime
from tiny.runtime.cpu import CPUDevice, CPUProgram, LLVMProgram, find_clang, find_compiler

pytest.importorskip("llvmlite.binding", reason="llvmlite is not installed: pip install 'tiny-runtime-misc[llvm]'")

# out[i] = a[i] + b[i] for the i of this thread's part: n elements split over the threads
ADD_IR = """
define void @add(ptr noalias %out, ptr noalias %a, ptr noalias %b, i32 %n, i32 %thread) {
entry:
  %start = mul i32 %thread, %n
  br label %loop
loop:
  %i = phi i32 [0, %entry], [%next, %body]
  %more = icmp slt i32 %i, %n
  br i1 %more, label %body, label %done
body:
  %j = add i32 %start, %i
  %pa = getelementptr float, ptr %a, i32 %j
  %pb = getelementptr float, ptr %b, i32 %j
  %po = getelementptr float, ptr %out, i32 %j
  %x = load float, ptr %pa
  %y = load float, ptr %pb
  %s = fadd float %x, %y
  store float %s, ptr %po
  %next = add i32 %i, 1
  br label %loop
done:
  ret void
}
"""


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Each test compiles into a cache of its own."""
    monkeypatch.setenv("CACHEDB", str(tmp_path / "cache.db"))
    yield


def llvm_device() -> CPUDevice:
    return CPUDevice("CPU:LLVM", "LLVM")


def buffers(*arrays: np.ndarray) -> list[int]:
    """Arrays as the CPU allocator's opaque handles: their addresses (the caller keeps the arrays alive)."""
    return [a.ctypes.data for a in arrays]


def test_cpu_llvm_through_entry_points() -> None:
    dev = Device["CPU:LLVM"]
    # (where no clang is installed LLVM is the CPU's default path, and CPU:LLVM the CPU device itself)
    default = CPUDevice.default_renderer() == "LLVM"
    assert isinstance(dev, CPUDevice) and dev.name == ("CPU" if default else "CPU:LLVM") and dev.renderer_name == "LLVM"
    assert Device["cpu:llvm"] is dev and (Device["CPU"] is dev) == default
    if "LLVM" in renderer_entry_points():  # the renderer comes with tiny-codegen
        caps = dev.renderer.caps
        assert caps.language == "LLVM" and caps.threads == dev.threads and caps.vector_width in (4, 8, 16)
        assert dtypes.bfloat16 in caps.dtypes and dtypes.float64 in caps.dtypes
    status = {s.name: s for s in available()}
    assert "LLVM" in status["CPU"].renderers


def test_opens_and_runs_without_a_c_compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    monkeypatch.delenv("CC", raising=False)
    find_compiler.cache_clear()
    find_clang.cache_clear()
    try:
        with pytest.raises(DeviceUnavailable):
            find_compiler()
        dev = llvm_device()
        binary = dev.compile(ADD_IR)
        prog = dev.load(CompiledProgram("add", dev.name, "LLVM", ADD_IR, binary, 3, (0,), ("n",)))
        a, b, out = np.arange(8, dtype=np.float32), np.full(8, 0.5, np.float32), np.zeros(8, np.float32)
        prog(*buffers(out, a, b), vals=(4,), global_size=(2, 1, 1), wait=True)
    finally:
        find_compiler.cache_clear()
        find_clang.cache_clear()
    assert isinstance(prog, LLVMProgram)
    np.testing.assert_array_equal(out, np.arange(8) + 0.5)


def test_without_llvmlite_it_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(llvm_runtime, "binding", lambda: None)
    with pytest.raises(DeviceUnavailable, match=r"llvmlite.*pip install llvmlite"):
        llvm_device()


def test_llvmlite_missing_in_a_fresh_process(tmp_path: Path) -> None:
    """A process where `import llvmlite` fails still opens CPU (C) and reports CPU:LLVM's reason."""
    blocker = tmp_path / "block"
    blocker.mkdir()
    (blocker / "llvmlite").mkdir()
    (blocker / "llvmlite" / "__init__.py").write_text("raise ImportError('no llvmlite here')\n")
    code = (
        "from tiny.ir.device import Device, DeviceUnavailable\n"
        "try:\n    Device['CPU:LLVM']\nexcept DeviceUnavailable as e:\n    print('unavailable:', e)\n"
    )
    env = os.environ | {"PYTHONPATH": str(blocker)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("unavailable:") and "pip install" in r.stdout


def test_the_thread_split_runs_on_the_shared_pool() -> None:
    dev = llvm_device()
    prog = LLVMProgram(dev, "add", dev.compile(ADD_IR))
    assert isinstance(prog, CPUProgram)  # the C path's launch: one call per thread, its number last
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal(4 * 256).astype(np.float32), rng.standard_normal(4 * 256).astype(np.float32)
    out = np.zeros_like(a)
    assert prog(*buffers(out, a, b), vals=(256,), global_size=(4, 1, 1), wait=True) > 0
    np.testing.assert_array_equal(out, a + b)


def test_bad_ir_is_a_compile_error_with_the_source() -> None:
    src = "define void @broken() {\nentry:\n  %x = add i32 1\n  ret void\n}\n"
    with pytest.raises(CompileError, match="LLVM rejected") as info:
        llvm_device().compile(src)
    assert "@broken" in str(info.value)
    unverifiable = "define i32 @f() {\nentry:\n  ret void\n}\n"
    with pytest.raises(CompileError):
        llvm_device().compile(unverifiable)


def test_the_cache_key_names_llvm_and_the_host_cpu() -> None:
    key = llvm_device().compiler().cachekey
    h = llvm_runtime.host()
    assert key is not None and key.startswith("llvm:")
    assert h.llvm_version in key and h.cpu in key and h.features in key and h.triple in key


def test_compiled_objects_come_from_the_disk_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = llvm_device()
    first = dev.compile(ADD_IR)
    calls: list[str] = []
    original = llvm_runtime.LLVMCompiler.compile
    monkeypatch.setattr(llvm_runtime.LLVMCompiler, "compile", lambda c, src: calls.append(src) or original(c, src))
    again = llvm_device()
    assert again.compile(ADD_IR) == first and not calls


def test_two_programs_of_one_name_stay_apart() -> None:
    dev = llvm_device()
    seven = "define void @k(ptr %out) {\nentry:\n  store i32 7, ptr %out\n  ret void\n}\n"
    eight = "define void @k(ptr %out) {\nentry:\n  store i32 8, ptr %out\n  ret void\n}\n"
    p7, p8 = LLVMProgram(dev, "k", dev.compile(seven)), LLVMProgram(dev, "k", dev.compile(eight))
    out = np.zeros(2, np.int32)
    p7(out.ctypes.data, wait=True)  # (waited for: launches may run on the device's thread)
    p8(out[1:].ctypes.data, wait=True)
    assert out.tolist() == [7, 8]


def test_a_missing_function_is_a_clear_error() -> None:
    dev = llvm_device()
    with pytest.raises(CompileError, match="no function 'other'"):
        LLVMProgram(dev, "other", dev.compile(ADD_IR))


def test_rendered_kernels_run_with_variables_and_threads() -> None:
    if "LLVM" not in renderer_entry_points():
        pytest.skip("the LLVM renderer comes with tiny-codegen, which is not installed")
    dev = llvm_device()
    i32 = dtypes.int32
    out = UOp(Ops.DEFINE_GLOBAL, i32.ptr(64), (), 0)
    n = UOp(Ops.DEFINE_VAR, i32, (), ("n", 1, 32))
    g = UOp(Ops.SPECIAL, i32, (), ("gidx0", 2))
    r = UOp.range(n, 0)
    base = g * UOp.const(i32, 32)
    idx = UOp(Ops.INDEX, out.dtype, (out, base + r))
    value = (r * r).alu(Ops.IDIV, n) + g
    uops = [out, n, g, r, UOp.const(i32, 32), base, base + r, idx, r * r, value.src[0], value]
    uops += [UOp(Ops.STORE, src=(idx, value)), UOp(Ops.ENDRANGE, src=(r,))]
    src = dev.renderer.render("squares", uops)
    prog = dev.load(CompiledProgram("squares", dev.name, "LLVM", src, dev.compile(src), 1, (0,), ("n",)))
    res = np.full(64, -1, np.int32)
    prog(res.ctypes.data, vals=(20,), global_size=(2, 1, 1), wait=True)
    want = [(k * k // 20 + t) if k < 20 else -1 for t in (0, 1) for k in range(32)]
    assert res.tolist() == want


def test_float16_follows_the_host(monkeypatch: pytest.MonkeyPatch) -> None:
    h = llvm_runtime.host()
    dev = llvm_device()
    assert ("f16" in dev.renderer_target().split(";")[-1].split(",")) == h.has_f16_conversions
    monkeypatch.setattr("platform.machine", lambda: "x86_64")
    assert not llvm_runtime.Host("x86_64-unknown-linux-gnu", "k8", "+sse2,-f16c", h.llvm_version).has_f16_conversions
    assert llvm_runtime.Host("x86_64-unknown-linux-gnu", "znver3", "+avx2,+f16c", h.llvm_version).has_f16_conversions
