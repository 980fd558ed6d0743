"""What surrounds the kernels: the Python cost of small ops, a jitted function's replay cost per kernel, and the
time from starting a fresh process to its first result (imports, device start, compilation).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import weakref

import numpy as np

from bench.core import MS, US_PER_KERNEL, Params, Prepared, Setup, Target, Unavailable, Workload
from bench.frameworks import (
    TinyJit,
    spawn_fresh,
    tiny_done,
    tiny_process_env,
    tiny_upload,
    tinygrad,
    tinygrad_done,
    tinygrad_upload,
    torch,
)
from tiny.tensor import GlobalCounters, Tensor

SMALL = np.arange(1, 5, dtype=np.float32)  # the 4-element input of the small-op workloads

# ---------------------------------------------------------------- 100 small ops, each realized


def _each_numpy(params: Params, device: str) -> Prepared:
    def run() -> np.ndarray:
        x = SMALL
        for _ in range(params["ops"]):
            x = x + 1
        return x

    return Prepared(run)


def _each_torch(params: Params, device: str) -> Prepared:
    start = torch.from_numpy(SMALL)

    def run() -> object:
        x = start
        for _ in range(params["ops"]):
            x = x + 1
        return x

    return Prepared(run)


def _each_tiny(params: Params, device: str) -> Prepared:
    start = tiny_upload(SMALL, device)

    def run() -> None:
        x = start
        for _ in range(params["ops"]):
            x = (x + 1).realize()
        tiny_done(x)

    return Prepared(run)


def _each_tinygrad(params: Params, device: str) -> Prepared:
    start = tinygrad_upload(SMALL)

    def run() -> None:
        x = start
        for _ in range(params["ops"]):
            x = (x + 1).realize()
        tinygrad_done(x)

    return Prepared(run)


OVERHEAD_EACH = Workload(
    name="overhead_each",
    group="overhead",
    what="`x = x + 1` on a 4-element tensor, each op realized (tiny: scheduled, a cached kernel run); total ms",
    metrics=(MS,),
    full={"ops": 100},
    quick={"ops": 100},
    setups={"tiny": _each_tiny, "numpy": _each_numpy, "torch": _each_torch, "tinygrad": _each_tinygrad},
    target=Target("<3 ms", max_figure=3.0),
    reps=10,
)

# ---------------------------------------------------------------- 100 small ops recorded, then one realize


def _lazy_tiny(params: Params, device: str) -> Prepared:
    start = tiny_upload(SMALL, device)

    def run() -> None:
        x = start
        for _ in range(params["ops"]):
            x = x + 1
        tiny_done(x)

    return Prepared(run)


def _lazy_tinygrad(params: Params, device: str) -> Prepared:
    start = tinygrad_upload(SMALL)

    def run() -> None:
        x = start
        for _ in range(params["ops"]):
            x = x + 1
        tinygrad_done(x)

    return Prepared(run)


OVERHEAD_LAZY = Workload(
    name="overhead_lazy",
    group="overhead",
    what="the same 100 ops recorded lazily and realized once (NumPy and PyTorch are eager: the same loop); total ms",
    metrics=(MS,),
    full={"ops": 100},
    quick={"ops": 100},
    setups={"tiny": _lazy_tiny, "numpy": _each_numpy, "torch": _each_torch, "tinygrad": _lazy_tinygrad},
    reps=10,
)

# ---------------------------------------------------------------- a jitted function's replay, per kernel


def _replay_tiny(params: Params, device: str) -> Prepared:
    if TinyJit is None:
        raise Unavailable("TinyJit not available")
    start = tiny_upload(SMALL, device)

    def chain(x: Tensor) -> Tensor:
        for _ in range(params["kernels"]):
            x = (x * 0.5 + 1).realize()
        return x

    before = GlobalCounters.kernels
    chain(start)
    kernels = GlobalCounters.kernels - before
    jitted = TinyJit(chain)
    calls = params["calls"]

    def run() -> None:
        for _ in range(calls):
            out = jitted(start)
        tiny_done(out)

    return Prepared(run, units=calls * kernels, note=f"{kernels} kernels per call")


def _replay_tinygrad(params: Params, device: str) -> Prepared:
    counters = tinygrad.helpers.GlobalCounters
    start = tinygrad_upload(SMALL)

    def chain(x):  # a tinygrad Tensor
        for _ in range(params["kernels"]):
            x = (x * 0.5 + 1).realize()
        return x

    before = counters.kernel_count
    chain(start)
    kernels = counters.kernel_count - before
    jitted = tinygrad.TinyJit(chain)
    calls = params["calls"]

    def run() -> None:
        for _ in range(calls):
            out = jitted(start)
        tinygrad_done(out)

    return Prepared(run, units=calls * kernels, note=f"{kernels} kernels per call")


JIT_REPLAY = Workload(
    name="jit_replay",
    group="overhead",
    what="a jitted function of 8 small dependent kernels called again and again; time per kernel replayed",
    metrics=(US_PER_KERNEL,),
    full={"kernels": 8, "calls": 50},
    quick={"kernels": 8, "calls": 5},
    setups={"tiny": _replay_tiny, "tinygrad": _replay_tinygrad},
    target=Target("<20 us/kernel", max_figure=20.0),
)

# ---------------------------------------------------------------- a fresh process's first result

FIRST_RESULT_CODE = {  # {n}: the matrices' size
    "tiny": "from tiny.tensor import Tensor; print((Tensor.rand({n}, {n}) @ Tensor.rand({n}, {n})).sum().item())",
    "numpy": "import numpy as np; print((np.random.rand({n}, {n}) @ np.random.rand({n}, {n})).sum())",
    "torch": "import torch; print((torch.rand({n}, {n}) @ torch.rand({n}, {n})).sum().item())",
    "tinygrad": "from tinygrad import Tensor; print((Tensor.rand({n}, {n}) @ Tensor.rand({n}, {n})).sum().item())",
}


def _spawn(framework: str, n: int, device: str, cache: str | None = None) -> None:
    """Run the framework's first-result snippet in a new Python and wait for it: with an empty compile cache, or
    with the cache file `cache` (tiny's and tinygrad's)."""
    env = tiny_process_env(device) if framework == "tiny" else {}
    spawn_fresh(FIRST_RESULT_CODE[framework].format(n=n), env, cache)


def _first_result(framework: str, warm: bool) -> Setup:
    def setup(params: Params, device: str) -> Prepared:
        if not warm:
            return Prepared(lambda: _spawn(framework, params["n"], device))
        scratch = tempfile.mkdtemp(prefix="tiny-bench-warm-")  # filled by the warmup run, read by the timed ones
        cache = os.path.join(scratch, "cache.db")
        prepared = Prepared(lambda: _spawn(framework, params["n"], device, cache))
        weakref.finalize(prepared, shutil.rmtree, scratch, True)
        return prepared

    return setup


def _first_result_workload(warm: bool) -> Workload:
    cache = "the compile cache its warmup run filled" if warm else "an empty compile cache"
    return Workload(
        name="first_result_warm" if warm else "first_result",
        group="startup",
        what=f"wall time of `python -c` computing (rand(n,n) @ rand(n,n)).sum() with {cache}",
        metrics=(MS,),
        full={"n": 64},
        quick={"n": 64},
        setups={name: _first_result(name, warm) for name in FIRST_RESULT_CODE},
        reps=3,
        quick_reps=1,
    )


FIRST_RESULT = _first_result_workload(warm=False)
FIRST_RESULT_WARM = _first_result_workload(warm=True)
