"""The CUDA runtime's plumbing against a stand-in driver (fake_libcuda.c, built here with the C compiler): the ctypes
signatures and argument arrays, copies through the pinned staging buffer in pieces, views, peer copies between two
GPUs, launch timing by events, the driver's JIT log in a CompileError, the PTX ISA a driver can take, an old GPU's
refusal, and TinyJit's CUDA graph (built, replayed, and replayed with new buffers). The stand-in runs no GPU code;
it knows one kernel by name (fake_add1: out[i] = in[i] + 1). Skips where no C compiler is on PATH."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tiny.ir.config import Context
from tiny.ir.device import CompileError, DeviceUnavailable, GraphLaunch
from tiny.ir.dtypes import dtypes
from tiny.runtime.nv import cuda

SOURCE = Path(__file__).with_name("fake_libcuda.c")
CC = next((c for c in ("clang-19", "clang", "gcc", "cc") if shutil.which(c)), None)


@pytest.fixture
def fake(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ctypes.CDLL]:
    """The stand-in driver in place of libcuda.so.1 (the caches of the real one cleared before and after)."""
    if CC is None:
        pytest.skip("no C compiler on PATH to build the stand-in driver")
    lib = tmp_path / "libcuda_fake.so"
    subprocess.run([CC, "-shared", "-fPIC", "-O1", str(SOURCE), "-o", str(lib)], check=True)
    caches = (cuda.library, cuda.gpus, cuda.driver_version, cuda.graph_api)
    for c in caches:
        c.cache_clear()
    monkeypatch.setattr(cuda, "LIBRARY", str(lib))
    yield ctypes.CDLL(str(lib))
    for c in caches:
        c.cache_clear()


def counter(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.c_int.in_dll(lib, name).value


def test_the_gpus_and_what_the_renderers_are_told(fake: ctypes.CDLL) -> None:
    dev = cuda.CUDADevice("CUDA", "PTX")
    assert dev.gpu.name == "Fake H100" and dev.gpu.arch == "sm_90" and cuda.driver_version() == 12040
    limits = "vector_width=4;local_max=1024,1024,64;local_total_max=1024;shared_max=232448;max_grid=65535"
    assert dev.renderer_target() == f"arch=sm_90;{limits}"  # (the shared memory a kernel may opt in to)
    assert isinstance(dev.compiler(), cuda.PTXCompiler) and dev.nvrtc is None  # PTX needs no NVRTC
    assert cuda.CUDADevice("CUDA:1", "PTX").gpu.arch == "sm_80"
    with pytest.raises(DeviceUnavailable, match=r"Fake P100 is sm_61; tiny's CUDA runtime needs sm_70"):
        cuda.CUDADevice("CUDA:2", "PTX")
    with pytest.raises(
        DeviceUnavailable, match=r"CUDA:7 does not exist: this machine has 3 GPU\(s\): CUDA:0 Fake H100"
    ):
        cuda.CUDADevice("CUDA:7", "PTX")


def test_tf32_is_said_to_the_renderer_and_gives_it_the_tf32_tensor_core(fake: ctypes.CDLL) -> None:
    """TF32=1: the target says tf32=1 (BEAM's cache keys by it), and the renderer declares mma.m16n8k8.tf32 after
    the 16-bit cores, so the rules put float32 products on it; without, the target and the cores are as before."""
    plain = cuda.CUDADevice("CUDA", "PTX")
    assert "tf32" not in plain.renderer_target()
    assert all(tc.dtype_in != dtypes.float32 for tc in plain.renderer.caps.tensor_cores)
    with Context(TF32=1):
        dev = cuda.CUDADevice("CUDA", "PTX")
    assert dev.renderer_target().endswith(";tf32=1")
    assert [tc.name for tc in dev.renderer.caps.tensor_cores][-1] == "nv_m16n8k8_tf32_float32"


def test_copies_go_through_the_staging_buffer_in_pieces(fake: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda, "STAGING_BYTES", 64)
    dev = cuda.CUDADevice("CUDA", "PTX")
    data = np.arange(250, dtype=np.float32)  # 1000 bytes: 16 pieces
    mem = dev.allocator.alloc(data.nbytes)
    dev.allocator.copyin(mem, memoryview(data.tobytes()))
    out = bytearray(data.nbytes)
    dev.allocator.copyout(memoryview(out), mem)
    assert np.array_equal(np.frombuffer(out, np.float32), data)
    part = bytearray(32)
    dev.allocator.copyout(memoryview(part), dev.allocator.offset(mem, 40, 32))
    assert np.array_equal(np.frombuffer(part, np.float32), data[10:18])
    with pytest.raises(MemoryError, match="CUDA_ERROR_OUT_OF_MEMORY"):
        dev.allocator.alloc(1 << 41)


def test_copies_between_gpus_are_peer_copies(fake: ctypes.CDLL) -> None:
    a, b = cuda.CUDADevice("CUDA", "PTX"), cuda.CUDADevice("CUDA:1", "PTX")
    data = np.arange(16, dtype=np.int32).tobytes()
    src, dst = a.allocator.alloc(64), b.allocator.alloc(64)
    a.allocator.copyin(src, memoryview(data))
    b.allocator.transfer(dst, src, 64, a, b)
    assert counter(fake, "fake_peer_copies") == 1
    out = bytearray(64)
    b.allocator.copyout(memoryview(out), dst)
    assert bytes(out) == data


def _add1(dev: cuda.CUDADevice, n: int) -> tuple[cuda.CUDAProgram, int, int, np.ndarray]:
    prog = cuda.CUDAProgram(dev, "fake_add1", b"\x7fELF a cubin")
    x = np.arange(n, dtype=np.float32)
    src, out = dev.allocator.alloc(4 * n), dev.allocator.alloc(4 * n)
    dev.allocator.copyin(src, memoryview(x.tobytes()))
    return prog, out, src, x


def _read(dev: cuda.CUDADevice, mem: int, n: int) -> np.ndarray:
    out = bytearray(4 * n)
    dev.allocator.copyout(memoryview(out), mem)
    return np.frombuffer(out, np.float32)


def test_a_launch_passes_buffers_and_ints_and_is_timed_by_events(fake: ctypes.CDLL) -> None:
    dev = cuda.CUDADevice("CUDA", "PTX")
    prog, out, src, x = _add1(dev, 100)
    seconds = prog(out, src, global_size=(4, 1, 1), local_size=(32, 1, 1), vals=(100,), wait=True)
    assert seconds == pytest.approx(0.5e-3)
    assert np.array_equal(_read(dev, out, 100), x + 1)
    assert prog(out, src, global_size=(1, 1, 1), local_size=(1, 1, 1), vals=(100,)) is None
    with pytest.raises(ValueError, match="need 3 sizes >= 1"):
        prog(out, src, global_size=(0, 1, 1), vals=(100,))


def test_a_module_the_driver_refuses_is_a_compile_error_with_its_log(fake: ctypes.CDLL) -> None:
    dev = cuda.CUDADevice("CUDA", "PTX")
    with pytest.raises(CompileError, match=r"CUDA_ERROR_INVALID_PTX[\s\S]*fake error in the PTX"):
        cuda.CUDAProgram(dev, "k", b"BAD ptx")


def test_ptx_newer_than_the_driver_is_refused_plainly(fake: ctypes.CDLL) -> None:
    compiler = cuda.CUDADevice("CUDA", "PTX").compiler()
    ok = ".version 7.8\n.target sm_90\n.address_size 64\n"
    assert compiler.compile(ok).endswith(b"\0")
    with pytest.raises(
        CompileError, match=r"driver \(CUDA 12\.4\) cannot assemble PTX ISA 8\.6, which needs CUDA 12\.7"
    ):
        compiler.compile(ok.replace("7.8", "8.6"))


def test_a_kernel_past_48_kib_of_shared_memory_is_allowed_it_and_given_it_at_each_launch(fake: ctypes.CDLL) -> None:
    """A source that says `// dynamic shared memory: N bytes` (tiny.codegen.renderer.shared) compiles to an image
    that carries N; the program strips it, allows the kernel N bytes (cuFuncSetAttribute) and gives them at each
    launch, a graph's too. More than the GPU gives a block: a CompileError saying both."""
    dev = cuda.CUDADevice("CUDA", "PTX")
    ptx = ".version 7.8\n.target sm_90\n.address_size 64\n"
    sized = "// dynamic shared memory: 65536 bytes\n" + ptx
    image = dev.compiler().compile(sized)
    assert cuda.split_dynamic_shared(image) == (sized.encode() + b"\0", 65536)
    assert cuda.split_dynamic_shared(dev.compiler().compile(ptx)) == (ptx.encode() + b"\0", 0)
    prog = cuda.CUDAProgram(dev, "fake_add1", image)
    assert counter(fake, "fake_dynamic_allowed") == 65536
    x = np.arange(64, dtype=np.float32)
    src, out = dev.allocator.alloc(4 * 64), dev.allocator.alloc(4 * 64)
    dev.allocator.copyin(src, memoryview(x.tobytes()))
    prog(out, src, global_size=(2, 1, 1), local_size=(32, 1, 1), vals=(64,))
    assert counter(fake, "fake_launch_shared") == 65536 and np.array_equal(_read(dev, out, 64), x + 1)
    plain, _, _, _ = _add1(dev, 64)
    plain(out, src, global_size=(2, 1, 1), local_size=(32, 1, 1), vals=(64,))
    assert counter(fake, "fake_launch_shared") == 0
    replay = dev.graph([GraphLaunch(prog, (out, src), (2, 1, 1), (32, 1, 1), (64,))])
    assert replay is not None
    replay([(out, src)], {})
    assert counter(fake, "fake_launch_shared") == 65536
    too_much = dev.compiler().compile("// dynamic shared memory: 300000 bytes\n" + ptx)
    with pytest.raises(CompileError, match="needs 300000 bytes of shared memory, Fake H100 gives a block 232448"):
        cuda.CUDAProgram(dev, "fake_add1", too_much)


def test_a_cuda_graph_replays_the_kernels_with_new_buffers(fake: ctypes.CDLL) -> None:
    dev = cuda.CUDADevice("CUDA", "PTX")
    prog, out, src, x = _add1(dev, 64)
    launch = GraphLaunch(prog, (out, src), (2, 1, 1), (32, 1, 1), (64,))
    replay = dev.graph([launch, GraphLaunch(prog, (src, out), (2, 1, 1), (32, 1, 1), (64,))])
    assert isinstance(replay, cuda.CUDAGraph)
    replay([(out, src), (src, out)], {})  # out = x + 1, then src = out + 1
    assert counter(fake, "fake_graph_launches") == 1 and counter(fake, "fake_launches") == 2
    assert np.array_equal(_read(dev, src, 64), x + 2)
    other = dev.allocator.alloc(4 * 64)
    replay([(other, src), (src, other)], {})  # new buffers: the nodes' parameters are set again
    assert np.array_equal(_read(dev, other, 64), x + 3) and np.array_equal(_read(dev, src, 64), x + 4)
    assert dev.graph([]) is None
    # a launch given a Variable's value at each replay: a kernel node's values are fixed, so no graph
    assert dev.graph([launch, GraphLaunch(prog, (src, out), (2, 1, 1), (32, 1, 1), var_names=("n",))]) is None
