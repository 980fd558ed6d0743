"""The CPU device on all cores: a kernel split across threads computes bit for bit what one thread computes, the
thread count comes from the machine or THREADS, and every kernel of a device shares its one pool (no
oversubscription)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
from tensor_helpers import errors_in_threads, poison

from tiny.codegen import Opt, OptOps, get_program
from tiny.codegen.opt.actions import MAX_THREADS
from tiny.ir.device import Device
from tiny.runtime.cpu import _pool, _pool_compiler, _threads, share
from tiny.tensor import Tensor
from tiny.tensor.realize import compiled


def _run(item, opts):  # noqa: ANN001, ANN202
    dev = Device["CPU"]
    prog = get_program(item.ast, dev, opts)
    poison(item.buffers[0].ensure_allocated())  # a cell no thread writes cannot keep the last run's value
    dev.load(prog)(*[b.ensure_allocated().opaque for b in item.buffers], global_size=prog.global_size)
    return item.buffers[0].as_bytes(), prog.global_size


def test_threads_give_the_same_bits_as_one_thread() -> None:
    rng = np.random.default_rng(1)
    a = Tensor(rng.standard_normal((96, 80)).astype(np.float32), device="CPU").realize()
    b = Tensor(rng.standard_normal((80, 64)).astype(np.float32), device="CPU").realize()
    (item,) = (a @ b).schedule()
    base = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 2, 4)]
    one, gs1 = _run(item, base)
    for n in (2, 3, 4):
        many, gs = _run(item, base + [Opt(OptOps.THREAD, 0, n)])
        assert gs == (n, 1, 1) and gs1 == (1, 1, 1)
        assert many == one, f"{n} threads changed the result"
    np.testing.assert_allclose(
        np.frombuffer(one, np.float32).reshape(96, 64), a.numpy() @ b.numpy(), rtol=1e-4, atol=1e-4
    )


def test_a_prime_dim_is_split_across_threads_and_gives_the_same_bits() -> None:
    """2**20 + 7 is prime: no thread count divides it, so the rules pad it to a multiple of the threads and each
    thread's loop stops where the dim ends. Every output is written (the buffer is poisoned first), bit for bit as
    one thread writes it."""
    n = 2**20 + 7
    rng = np.random.default_rng(2)
    a, b = (Tensor(rng.standard_normal(n).astype(np.float32), device="CPU").realize() for _ in range(2))
    (item,) = ((a * b + 1).exp()).schedule()
    one, _ = _run(item, [])
    for threads in (2, 3, 4):
        many, gs = _run(item, [Opt(OptOps.PADTO, 0, threads), Opt(OptOps.THREAD, 0, threads)])
        assert gs == (threads, 1, 1) and many == one, f"{threads} threads changed the result"
    want = np.exp(a.numpy() * b.numpy() + 1)
    np.testing.assert_allclose(np.frombuffer(one, np.float32), want, rtol=2e-6, atol=1e-30)
    prog, _ = compiled(item.ast, "CPU")  # what the rules chose
    assert prog.global_size[0] == min(Device["CPU"].threads, MAX_THREADS), prog.global_size


def test_a_sum_down_an_odd_number_of_columns() -> None:
    """4099 columns (prime): the rules pad them to whole tiles of 32 (the last tile's lanes past the end masked) and
    split the tiles across the threads; every column's sum is right."""
    xv = np.random.default_rng(3).standard_normal((300, 4099)).astype(np.float32)
    x = Tensor(xv, device="CPU").realize()
    (item,) = x.sum(0).schedule()
    prog, _ = compiled(item.ast, "CPU")
    assert prog.global_size[0] == min(Device["CPU"].threads, MAX_THREADS), prog.global_size  # (only once padded)
    np.testing.assert_allclose(x.sum(0).numpy(), xv.sum(0), rtol=1e-4, atol=1e-4)


def test_one_pool_for_every_kernel_and_thread() -> None:
    """Four Python threads run threaded kernels at once: the kernels' threads all come from the device's one pool of
    its share of the cores (all of them, where it is the only CPU device open: the launching thread and the pool's
    workers), one kernel at a time, and each sum is exact."""
    dev = Device["CPU"]
    key = (dev.name, share(), _pool_compiler(dev), os.getpid())
    pool = _pool(*key)
    if pool is not None:  # (the pool in C, where a C compiler built it)
        assert pool is _pool(*key) and pool.workers == share() - 1  # whoever launches
    x = np.ones(1 << 21, dtype=np.float32)  # 2M: the first of the sum's two kernels is split across the cores
    threaded = [compiled(i.ast, "CPU")[0].global_size[0] for i in (Tensor(x, device="CPU") * 2).sum().schedule()]
    assert max(threaded) > 1 or dev.threads == 1, threaded
    results = {}

    def work(i: int) -> None:
        for _ in range(3):
            results[i] = (Tensor(x, device="CPU") * i).sum().item()

    errors = errors_in_threads(work, 4)
    assert not errors
    assert results == {i: float(i * x.size) for i in range(4)}  # (whole numbers below 2**24: exact in float32)
    if pool is None:  # (Python threads)
        python_threads = _threads(dev.name, share())
        assert python_threads._max_workers == share() and len(python_threads._threads) <= share()


def test_thread_count_from_the_machine_or_threads() -> None:
    code = "from tiny.ir.device import Device; d = Device['CPU']; print(d.threads, d.renderer.caps.threads)"
    env = dict(os.environ, THREADS="3")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["3", "3"]
    env.pop("THREADS")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.split() == [str(len(os.sched_getaffinity(0)))] * 2
