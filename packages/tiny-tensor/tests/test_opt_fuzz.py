"""Random optimization actions on random kernels compute what the unoptimized kernel computes.

Kernels come from real tensor programs (matrix products, convolutions, reductions with odd sizes, padded,
flipped and strided views, several dtypes). For each, random sequences of legal actions (the ones BEAM
tries) are applied; the optimized program runs on the same inputs and its output is compared with the
unoptimized program's. fp16 and bf16 products also run on the PYTHON emulator declaring the tensor cores of
sm_80, gfx1100 and gfx942: the rules' TC mapping, then random actions after it. The seed is fixed and the count
bounded in CI; `pytest --opt-fuzz=N` runs N sequences per kernel (and a different seed with --opt-fuzz-seed).
"""

from __future__ import annotations

import random
import zlib
from collections.abc import Callable

import numpy as np
import pytest
from tensor_helpers import poison

from tiny.codegen import Kernel, KernelOptError, Opt, OptOps, get_program
from tiny.codegen.opt.beam import actions
from tiny.codegen.opt.heuristic import hand_opts
from tiny.ir.device import Device
from tiny.runtime.python import PythonDevice
from tiny.tensor import Tensor, dtypes
from tiny.tensor.realize import run_schedule

rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _data_of_each_test(request: pytest.FixtureRequest) -> None:
    """Each test draws its inputs from a generator of its own (by its name): the same numbers whichever tests ran
    before it in the process (a subset, or pytest-xdist's share of them)."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def _t(*shape: int, dtype=dtypes.float32, device: str = "CPU") -> Tensor:  # noqa: ANN001
    if dtype.is_int:
        return Tensor(rng.integers(-9, 9, size=shape).astype(dtype.fmt), device=device).realize()
    return Tensor(rng.standard_normal(shape).astype(np.float32), device=device).cast(dtype).realize()


def _panel_product(a: Tensor, b: Tensor) -> Tensor:
    """a @ b with b copied into panels of 16 columns, as matmul does for big products on the CPU."""
    (m, k), n = a.shape, b.shape[1]
    panels = b.reshape(k, n // 16, 16).permute(1, 0, 2).contiguous()
    return (a.reshape(m, 1, 1, k) * panels.permute(0, 2, 1).reshape(1, n // 16, 16, k)).sum(3).reshape(m, n)


# name -> (tensor program on a device); each makes one or more kernels, the last is fuzzed
PROGRAMS: dict[str, Callable[[str], Tensor]] = {
    "matmul": lambda d: _t(13, 17, device=d) @ _t(17, 24, device=d),
    "matmul_panels": lambda d: _panel_product(_t(12, 20, device=d), _t(20, 32, device=d)),
    "matmul_relu_bias": lambda d: ((_t(16, 32, device=d) @ _t(32, 8, device=d)) + _t(8, device=d)).relu(),
    "batched_matmul": lambda d: _t(3, 5, 7, device=d) @ _t(3, 7, 6, device=d),
    "conv2d": lambda d: _t(2, 3, 9, 9, device=d).conv2d(_t(4, 3, 3, 3, device=d), padding=1, stride=2),
    "conv2d_dilated": lambda d: _t(1, 2, 8, 7, device=d).conv2d(_t(3, 2, 2, 3, device=d), dilation=2, padding=(1, 0)),
    "sum_rows_odd": lambda d: _t(7, 33, device=d).sum(1),
    "sum_cols_odd": lambda d: _t(33, 7, device=d).sum(0),
    "max_all": lambda d: _t(5, 11, 3, device=d).max(),
    "mean_keepdim": lambda d: _t(6, 10, 4, device=d).mean((0, 2), keepdim=True),
    "padded_sum": lambda d: _t(5, 6, device=d).pad(((1, 2), (3, 0))).sum(0),
    "masked_view": lambda d: _t(9, 10, device=d)[::2, 1:-1].flip(0) * 2 + 1,
    "broadcast_chain": lambda d: (_t(4, 1, 6, device=d) * _t(1, 5, 6, device=d)).exp2() - _t(6, device=d),
    "int_sum": lambda d: _t(12, 20, dtype=dtypes.int32, device=d).sum(1),
    "int64_matmul": lambda d: _t(6, 8, dtype=dtypes.int64, device=d) @ _t(8, 10, dtype=dtypes.int64, device=d),
    "float64_reduce": lambda d: (_t(16, 24, dtype=dtypes.float64, device=d) ** 2).sum(1).sqrt(),
    "half_add": lambda d: _t(8, 16, dtype=dtypes.float16, device=d) + _t(8, 16, dtype=dtypes.float16, device=d),
    "two_reductions": lambda d: _t(8, 12, device=d).sum(1) + _t(8, 12, device=d).max(1),
    "softmax_denominator": lambda d: (_t(10, 16, device=d) - 1).exp().sum(-1),
    # a row's reductions in the kernel of its elements (one kernel; ROWS on PYTHON)
    "softmax_rows": lambda d: _t(6, 32, device=d).softmax(-1),
    "log_softmax_rows": lambda d: _t(5, 48, device=d).log_softmax(-1),
    "layer_norm_rows": lambda d: _t(2, 3, 40, device=d).layernorm(-1) * _t(40, device=d),
    "where_compare": lambda d: (_t(8, 8, device=d) > 0).where(_t(8, 8, device=d), 0.5),
}


def _run(item, device, opts):  # noqa: ANN001, ANN202
    dev = Device[device]
    prog = get_program(item.ast, dev, opts)
    runner = dev.load(prog)
    for i in prog.outs:  # a poisoned output: a cell the kernel leaves unwritten cannot keep the last run's value
        poison(item.buffers[i])
    runner(
        *[b.ensure_allocated().opaque for b in item.buffers], global_size=prog.global_size, local_size=prog.local_size
    )
    out = item.buffers[0]
    if out.dtype == dtypes.bfloat16:  # (the top 16 bits of a float32)
        return (np.frombuffer(out.as_bytes(), np.uint16).astype(np.uint32) << 16).view(np.float32)
    return np.frombuffer(out.as_bytes(), dtype=np.dtype(out.dtype.fmt or "u2")).copy()


def _random_opts(kernel: Kernel, r: random.Random, steps: int) -> list[Opt]:
    k = kernel.copy()
    chosen: list[Opt] = []
    for _ in range(steps):
        options = actions(k)
        r.shuffle(options)
        for opt in options:
            try:
                k.apply(opt)
            except KernelOptError:
                continue
            chosen.append(opt)
            break
    return chosen


def _compare(got: np.ndarray, want: np.ndarray, what: str, half: bool = False, bf16: bool = False) -> None:
    """half: the kernel's dtype has 16 bits (bfloat16 comes back as float32). bf16: bfloat16's 8 bits of mantissa,
    where the unoptimized kernel's products, each rounded (a relative 2**-9), can differ from the tensor core's exact
    ones by more than 2e-2 in a sum of 24 of them that cancels (up to about 24 * 2**-9 = 0.05)."""
    if got.dtype.kind in "iub":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        tol = 6e-2 if bf16 else 2e-2 if half or got.dtype.itemsize <= 2 else 1e-4
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol, err_msg=what)


@pytest.mark.parametrize("name", sorted(PROGRAMS))
@pytest.mark.parametrize("target", ["CPU", "PYTHON"])
def test_random_actions_keep_results(name: str, target: str, request: pytest.FixtureRequest) -> None:
    count = request.config.getoption("--opt-fuzz")
    seed = request.config.getoption("--opt-fuzz-seed")
    out = PROGRAMS[name](target)
    items = out.schedule()
    run_schedule(items[:-1])
    item = items[-1]
    want = _run(item, target, [])
    kernel = Kernel(item.ast, Device[target].renderer.caps)
    r = random.Random(f"{seed}:{name}:{target}")
    tried = 0
    for i in range(count):
        opts = _random_opts(kernel, r, steps=1 + i % 4)
        if not opts:
            continue
        tried += 1
        _compare(_run(item, target, opts), want, f"{name} on {target} with {opts}")
    if kernel.axes:
        assert tried > 0, f"no legal action found for {name}"


# fp16/bf16 products the tensor cores take (after PADTO where M, N or K is not a multiple of the tile)
TC_PROGRAMS: dict[str, Callable[[str], Tensor]] = {
    "matmul_fp16": lambda d: _t(32, 48, dtype=dtypes.float16, device=d) @ _t(48, 32, dtype=dtypes.float16, device=d),
    "matmul_padded_bf16": lambda d: (
        _t(20, 24, dtype=dtypes.bfloat16, device=d) @ _t(24, 10, dtype=dtypes.bfloat16, device=d)
    ),
    "conv2d_fp16": lambda d: _t(1, 16, 4, 18, dtype=dtypes.float16, device=d).conv2d(
        _t(16, 16, 3, 3, dtype=dtypes.float16, device=d)
    ),
}
TC_ARCHS = {"sm_80": "PYTHON:80", "gfx1100": "PYTHON:1100", "gfx942": "PYTHON:942"}


@pytest.mark.parametrize("name", sorted(TC_PROGRAMS))
@pytest.mark.parametrize("arch", sorted(TC_ARCHS))
def test_random_actions_after_tensor_cores_keep_results(
    name: str, arch: str, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On the PYTHON emulator declaring a GPU's tensor cores: the rules' TC mapping (with the PADTOs it needs), then
    0 to 3 random legal actions (UPCAST, LOCAL, UNROLL, SWAP ... as BEAM tries them after TC), compute what the
    unoptimized kernel computes."""
    device = TC_ARCHS[arch]
    monkeypatch.setitem(Device._open, device, PythonDevice(device, "PYTHON", tensor_cores_of=arch))
    count = request.config.getoption("--opt-fuzz")
    seed = request.config.getoption("--opt-fuzz-seed")
    items = TC_PROGRAMS[name](device).schedule()
    run_schedule(items[:-1])
    item = items[-1]
    want = _run(item, device, [])
    kernel = Kernel(item.ast, Device[device].renderer.caps)
    rules = hand_opts(kernel)
    assert any(o.op is OptOps.TC for o in rules), f"the rules put {name} on no tensor core of {arch}: {rules}"
    prefix = rules[: next(i for i, o in enumerate(rules) if o.op is OptOps.TC) + 1]
    mapped = kernel.copy().apply_opts(prefix)
    r = random.Random(f"{seed}:{name}:{arch}")
    for i in range(count):
        opts = prefix + _random_opts(mapped, r, steps=i % 4)
        # (a tensor core's products are exact; the unoptimized kernel rounds each to the input dtype first)
        _compare(_run(item, device, opts), want, f"{name} on {arch} tensor cores with {opts}", True, "bf16" in name)
