"""The CPU device's worker threads in C (tiny.runtime.cpu_pool): every part of a kernel run once, on the launching
thread and the workers, with its arguments as the kernel declares them, awake or woken; kernels of more arguments than
the pool passes, and a forked process, still run."""

from __future__ import annotations

import ctypes
import os
import shutil
import threading
import time

import numpy as np
import pytest

from tiny.ir.device import Device
from tiny.runtime import cpu
from tiny.runtime.cpu import ClangCompiler, CPUProgram, find_compiler, load_library
from tiny.runtime.cpu_pool import Pool, kernel_address, source, supported

pytestmark = pytest.mark.skipif(
    not supported() or not (shutil.which("clang") or shutil.which("gcc") or cpu.find_clang()),
    reason="the pool in C needs a C compiler and a platform that passes arguments as it does",
)

COUNT = """
void count(int* restrict hits, int* restrict last, int add, int part) {
  hits[part] += add;
  last[part] = part;
}
"""


@pytest.fixture(scope="module")
def library() -> ctypes.CDLL:
    return load_library(ClangCompiler(find_compiler()).compile(source()), "cpu_pool_test")


def program(name: str, src: str) -> CPUProgram:
    dev = Device["CPU"]
    return CPUProgram(dev, name, dev.compile(src))


def address(array: np.ndarray) -> int:
    return array.ctypes.data


@pytest.mark.parametrize("spin_us", [0, 100_000], ids=["woken", "awake"])
@pytest.mark.parametrize("workers", [1, 3])
def test_every_part_runs_once(library: ctypes.CDLL, spin_us: int, workers: int) -> None:
    """A part taken twice or never shows in the counts (the job's number and its next part are taken together, so a
    worker late for one job cannot take a part of the next); workers asleep are woken, workers awake find the job."""
    pool = Pool(library, workers, spin_us)
    prog = program("count", COUNT)
    parts, runs = 37, 400
    hits, last = np.zeros(parts, np.int32), np.full(parts, -1, np.int32)
    for _ in range(runs):
        pool.run(prog.address, (address(hits), address(last), 3), parts)
    np.testing.assert_array_equal(hits, np.full(parts, 3 * runs))
    np.testing.assert_array_equal(last, np.arange(parts))


def test_parts_run_on_the_launching_thread_and_the_workers(library: ctypes.CDLL) -> None:
    """The launching thread takes parts too (it would only wait), and a worker woken takes the others."""
    pool = Pool(library, 1, 0)
    prog = program(
        "who",
        "#include <pthread.h>\n#include <unistd.h>\n"
        "void who(unsigned long* restrict out, int part) { out[part] = (unsigned long)pthread_self(); usleep(2000); }",
    )
    out = np.zeros(16, np.uint64)
    pool.run(prog.address, (address(out),), 16)
    ran = set(out.tolist())
    assert threading.get_ident() in ran and len(ran) == 2


def test_arguments_past_the_registers_arrive_as_declared(library: ctypes.CDLL) -> None:
    """Every argument goes as a 64-bit integer: ints (negative ones too) and pointers in registers and on the stack
    (x86-64 passes six in registers, AArch64 eight) reach the kernel as its C signature declares them."""
    n_bufs, n_ints = 9, 8
    params = ", ".join([f"float* restrict b{i}" for i in range(n_bufs)] + [f"int v{j}" for j in range(n_ints)])
    total = " + ".join(f"v{j}" for j in range(n_ints))
    body = " ".join(f"b{i}[part] = (float)({total}) * {i + 1} + part;" for i in range(n_bufs))
    prog = program("many", f"void many({params}, int part) {{ {body} }}")
    bufs = [np.zeros(5, np.float32) for _ in range(n_bufs)]
    ints = [-5, 7, 1 << 20, -(1 << 30), 0, 3, -1, 11]
    Pool(library, 1, 0).run(prog.address, (*map(address, bufs), *ints), 5)
    for i, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf, np.float32(sum(ints)) * (i + 1) + np.arange(5, dtype=np.float32))


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_a_batch_runs_its_kernels_in_order_each_in_its_parts(library: ctypes.CDLL, workers: int) -> None:
    """tiny_pool_batch: each kernel after the one before has finished (the third reads what the first two wrote),
    given its own arguments from the one array; a kernel of one part is called without a part's number."""
    scale = program("scale", "void scale(float* restrict x, int by) { for (int i = 0; i < 64; i++) x[i] *= by; }")
    add = program(
        "add",
        "void add(float* restrict x, int plus, int part) { for (int i = 0; i < 8; i++) x[part * 8 + i] += plus; }",
    )
    total = program(
        "total",
        "void total(float* restrict out, const float* restrict x) {"
        " float s = 0; for (int i = 0; i < 64; i++) s += x[i]; *out = s; }",
    )
    x, out = np.arange(64, dtype=np.float32), np.zeros(1, np.float32)
    run = Pool(library, workers, 0).batch([scale.address, add.address, total.address], [2, 2, 2], [1, 8, 1])
    for _ in range(3):
        run((ctypes.c_int64 * 6)(address(x), 3, address(x), -1, address(out), address(x)))
    want = np.arange(64, dtype=np.float32)
    for _ in range(3):
        want = want * 3 - 1
    np.testing.assert_array_equal(x, want)
    assert out[0] == want.sum()


def test_a_kernel_of_more_arguments_than_the_pool_passes_runs_on_python_threads(
    library: ctypes.CDLL, monkeypatch: pytest.MonkeyPatch
) -> None:
    most = library.tiny_pool_most_args()
    n_bufs = most + 1
    params = ", ".join(f"int* restrict b{i}" for i in range(n_bufs))
    body = " ".join(f"b{i}[part] = {i} * 100 + part;" for i in range(n_bufs))
    prog = program("wide", f"void wide({params}, int part) {{ {body} }}")
    monkeypatch.setattr(cpu, "share", lambda: 2)
    monkeypatch.setattr(Pool, "run", lambda *args: pytest.fail("the pool was given a kernel it cannot pass"))
    bufs = [np.zeros(4, np.int32) for _ in range(n_bufs)]
    prog.run(tuple(map(address, bufs)), 4)
    for i, buf in enumerate(bufs):
        np.testing.assert_array_equal(buf, i * 100 + np.arange(4))


def test_a_launch_goes_to_the_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel of several parts on a device of two or more threads runs on the pool in C, by its address."""
    prog = program("count", COUNT)
    monkeypatch.setattr(cpu, "share", lambda: 2)
    given: list[tuple[int, int]] = []
    real = Pool.run

    def run(self: Pool, kernel: int, args: tuple[int, ...], parts: int) -> None:
        given.append((kernel, parts))
        real(self, kernel, args, parts)

    monkeypatch.setattr(Pool, "run", run)
    hits, last = np.zeros(6, np.int32), np.zeros(6, np.int32)
    prog.run((address(hits), address(last)), 6, (2,))
    assert given == [(kernel_address(prog.fn), 6)]
    np.testing.assert_array_equal(hits, np.full(6, 2))


def test_a_forked_process_makes_a_pool_of_its_own() -> None:
    """A forked child has none of its parent's threads: a pool made before the fork would wait for them forever."""
    prog = program("count", COUNT)
    hits, last = np.zeros(8, np.int32), np.zeros(8, np.int32)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cpu, "share", lambda: 2)
        prog.run((address(hits), address(last)), 8, (1,))  # (the parent's pool, made now)
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 if its launch ran every part
            prog.run((address(hits), address(last)), 8, (1,))
            os._exit(0 if (hits == 2).all() else 1)
    deadline = time.monotonic() + 60
    while (done := os.waitpid(pid, os.WNOHANG))[0] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    if done[0] == 0:
        os.kill(pid, 9)
        os.waitpid(pid, 0)
        pytest.fail("the forked process's launch never came back")
    assert os.waitstatus_to_exitcode(done[1]) == 0
