"""fp16 and bf16 matrix products and convolutions on tensor cores, run on the PYTHON emulator declaring the tensor
cores of each GPU architecture tiny knows (NVIDIA sm_80+, AMD RDNA3, RDNA4, CDNA3), compared with NumPy at float32
accumulation. The hand heuristics choose the TC action; each test checks the kernel really used WMMA."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from tiny.codegen import Kernel, Opt, OptOps, get_program
from tiny.codegen.opt.heuristic import hand_opts
from tiny.ir.device import Device
from tiny.ir.dtypes import dtypes
from tiny.runtime.python import PythonDevice
from tiny.tensor import Tensor
from tiny.tensor.realize import capture, run_schedule

TARGETS = {"sm_80": "PYTHON:80", "gfx1100": "PYTHON:1100", "gfx1201": "PYTHON:1201", "gfx942": "PYTHON:942"}


@pytest.fixture(params=sorted(TARGETS))
def tc_device(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A PYTHON device (under a name of its own) whose renderer declares the tensor cores of one architecture."""
    name = TARGETS[request.param]
    monkeypatch.setitem(Device._open, name, PythonDevice(name, "PYTHON", tensor_cores_of=request.param))
    yield name


def rounded(shape: tuple[int, ...], dtype: str, seed: int) -> np.ndarray:
    """Random values exact in the input dtype (bfloat16 keeps the top 16 bits of a float32)."""
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    if dtype == "float16":
        return x.astype(np.float16).astype(np.float32)
    return (x.view(np.uint32) & 0xFFFF0000).view(np.float32)


def on(device: str, x: np.ndarray, dtype: str) -> Tensor:
    return Tensor(x, device=device).cast(dtypes.from_name(dtype))


def wmma_kernels(launches: list) -> list[str]:
    return [launch.program.src for launch in launches if launch.program is not None and "WMMA" in launch.program.src]


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "a_shape, b_shape, transpose",
    [
        ((32, 48), (48, 32), False),  # several tiles of M, N and K
        ((16, 16), (16, 16), False),  # one tile
        ((2, 32, 32), (2, 32, 16), False),  # batched
        ((48, 32), (16, 48), True),  # both inputs transposed: a.T @ b.T
        ((20, 24), (24, 10), False),  # M, K and N padded to the tile
        ((16, 64), (64, 16), False),  # a loop over K, two tiles of K per iteration (unrolled)
    ],
)
def test_matmul_on_tensor_cores(tc_device: str, dtype: str, a_shape: tuple, b_shape: tuple, transpose: bool) -> None:
    av, bv = rounded(a_shape, dtype, 1), rounded(b_shape, dtype, 2)
    a, b = on(tc_device, av, dtype), on(tc_device, bv, dtype)
    with capture() as launches:
        out = (a.T @ b.T if transpose else a @ b).cast(dtypes.float32).realize()
    want = av.T @ bv.T if transpose else av @ bv
    got = out.numpy()
    # float32 accumulation; the product rounded back to the input dtype (as torch does for fp16/bf16 matmuls)
    want = want.astype(np.float16).astype(np.float32) if dtype == "float16" else want
    tol = 2e-3 if dtype == "float16" else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    assert len(wmma_kernels(launches)) == 1


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_float32_accumulation_is_kept_where_the_output_is_float32(tc_device: str, dtype: str) -> None:
    """A sum in float32 of fp16/bf16 products (the matmul's own accumulator, before its cast back): the products
    exact, the sum as close to float64's as float32 accumulation allows."""
    av, bv = rounded((32, 64), dtype, 3), rounded((64, 16), dtype, 4)
    a, b = on(tc_device, av, dtype), on(tc_device, bv, dtype)
    prod = (a.reshape(32, 64, 1) * b.reshape(1, 64, 16)).cast(dtypes.float32)  # the product in the input dtype
    with capture() as launches:
        out = prod.sum(axis=1).realize()
    np.testing.assert_allclose(out.numpy(), av.astype(np.float64) @ bv.astype(np.float64), rtol=1e-5, atol=1e-5)
    assert len(wmma_kernels(launches)) == 1


def test_a_convolution_through_tensor_cores(tc_device: str) -> None:
    """M: the output's width (16), N: its channels, K: the input channels; the window stays a loop around it."""
    xv, wv = rounded((1, 16, 4, 18), "float16", 5), rounded((16, 16, 3, 3), "float16", 6)
    x, w = on(tc_device, xv, "float16"), on(tc_device, wv, "float16")
    with capture() as launches:
        out = x.conv2d(w).cast(dtypes.float32).realize()
    want = np.zeros((1, 16, 2, 16), np.float64)
    for i in range(3):
        for j in range(3):
            want += np.einsum("nchw,oc->nohw", xv[:, :, i : i + 2, j : j + 16], wv[:, :, i, j])
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    assert len(wmma_kernels(launches)) == 1


def test_kernels_that_do_not_qualify_run_without_tensor_cores(tc_device: str) -> None:
    av = rounded((6, 40), "float16", 7)  # M too small: padding it to the tile would more than double it
    bv = rounded((40, 24), "float16", 8)
    a, b = on(tc_device, av, "float16"), on(tc_device, bv, "float16")
    with capture() as launches:
        out = (a @ b).cast(dtypes.float32).realize()
    np.testing.assert_allclose(out.numpy(), (av @ bv).astype(np.float16).astype(np.float32), rtol=2e-3, atol=2e-2)
    assert wmma_kernels(launches) == []
    f = Tensor(rounded((32, 32), "float16", 9), device=tc_device)  # float32 inputs: no tensor core takes them
    with capture() as launches:
        (f @ f).realize()
    assert wmma_kernels(launches) == []


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "a_shape, b_shape, transpose",
    [
        ((128, 64), (64, 128), False),  # one workgroup's tiles, two iterations of K (both buffers)
        ((256, 96), (96, 128), False),  # several workgroups, three iterations (a buffer used twice)
        ((2, 128, 64), (2, 64, 128), False),  # batched
        ((96, 128), (128, 96), True),  # a.T @ b.T: the tiles read down columns of memory
        ((120, 40), (40, 100), False),  # M, K and N padded to the tile
    ],
)
def test_staged_matmul_on_nvidia_tensor_cores(dtype: str, a_shape: tuple, b_shape: tuple, transpose: bool) -> None:
    """sm_80's tensor cores with STAGE (the rules choose it there): each iteration of K, the workgroup copies its A
    and B tiles into local memory (two buffers, one barrier), and the warps read their fragments from there."""
    src = _sm_80_product(dtype, a_shape, b_shape, transpose, realized=False)
    assert "stage0" in src and "BARRIER" in src, "the rules staged the tiles through local memory"


def _sm_80_product(dtype: str, a_shape: tuple, b_shape: tuple, transpose: bool, realized: bool, stage: int = 0) -> str:
    """a @ b (a.T @ b.T) on the PYTHON emulator with sm_80's tensor cores, against NumPy; the source of its kernel.
    realized: the factors are buffers of dtype (else float32 buffers cast in the kernel). stage n >= 1: the rules'
    plan with its tiles copied asynchronously n K steps ahead (STAGE n) in place of their STAGE 0."""
    device = "PYTHON:80"
    Device._open.setdefault(device, PythonDevice(device, "PYTHON", tensor_cores_of="sm_80"))
    av, bv = rounded(a_shape, dtype, 11), rounded(b_shape, dtype, 12)
    a, b = on(device, av, dtype), on(device, bv, dtype)
    a, b = (a.realize(), b.realize()) if realized else (a, b)
    want = av.T @ bv.T if transpose else av @ bv
    want = want.astype(np.float16).astype(np.float32) if dtype == "float16" else want
    product = (a.T @ b.T if transpose else a @ b).cast(dtypes.float32)
    if stage:
        *before, item = product.schedule()
        run_schedule(before)
        dev = Device[device]
        rules = hand_opts(Kernel(item.ast, dev.renderer.caps))
        assert rules[-1].op is OptOps.STAGE, rules
        prog = get_program(item.ast, dev, [*rules[:-1], Opt(OptOps.STAGE, rules[-1].axis, stage)])
        bufs = [buf.ensure_allocated().opaque for buf in item.buffers]
        dev.load(prog)(*bufs, global_size=prog.global_size, local_size=prog.local_size)
        got, src = np.frombuffer(item.buffers[0].as_bytes(), np.float32).reshape(want.shape), prog.src
    else:
        with capture() as launches:
            product.realize()
        (src,), got = wmma_kernels(launches), product.numpy()
    tol = 2e-3 if dtype == "float16" else 2e-2
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
    return src


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize(
    "a_shape, b_shape, transpose",
    [
        ((128, 64), (64, 128), False),  # one workgroup's tiles, two iterations of K (the copy ahead once)
        ((256, 96), (96, 128), False),  # several workgroups, three iterations (a buffer filled twice)
        ((2, 128, 64), (2, 64, 128), False),  # batched
        ((96, 128), (128, 96), True),  # a.T @ b.T: the runs of memory lie along M and N
    ],
)
def test_matmul_staged_with_asynchronous_copies(dtype: str, a_shape: tuple, b_shape: tuple, transpose: bool) -> None:
    """sm_80's tensor cores with STAGE 1: the first iteration's tiles copied before the K loop, and each iteration's
    barrier waits for the copies of its tiles, then sends those of the next on their way. The emulator lands a
    COPY_ASYNC only at that barrier, so a read that did not wait for it reads the last tiles."""
    src = _sm_80_product(dtype, a_shape, b_shape, transpose, realized=True, stage=1)  # (a computed factor: by value)
    assert "COPY_ASYNC" in src and "arg=('async', 0)" in src, "the tiles were copied asynchronously"


@pytest.mark.parametrize(
    "stage, a_shape, b_shape, transpose",
    [
        (2, (128, 64), (64, 128), False),  # two iterations of K, both copied before the loop
        (2, (256, 160), (160, 128), False),  # five: each of the 3 buffers filled more than once
        (2, (224, 96), (96, 224), True),  # a.T @ b.T, seven
        (3, (64, 64), (64, 64), False),  # two iterations: fewer than the copies ahead
        (3, (64, 224), (224, 64), False),  # seven (4 buffers; the rules' tiles of 128 x 128 take 76 KiB: refused)
    ],
)
def test_matmul_staged_several_k_steps_ahead(stage: int, a_shape: tuple, b_shape: tuple, transpose: bool) -> None:
    """STAGE n: the first n iterations' tiles copied before the K loop (a group of copies each, a barrier that waits
    for none between them), n + 1 buffers, and each iteration's barrier waits for all but the last n - 1 groups (the
    copies of its own tiles have landed), then sends the tiles n iterations ahead on their way; a loop shorter than
    n copies all its tiles before it. The emulator lands a group only at the barrier that waits for it."""
    src = _sm_80_product("float16", a_shape, b_shape, transpose, realized=True, stage=stage)
    ahead = min(stage, (a_shape[0] if transpose else a_shape[-1]) // 32)  # (the rules' K step: 2 x 16)
    assert f"arg=('async', {ahead - 1})" in src, "the loop's barrier leaves the later copies in flight"
    assert src.count(f"arg=('async', {ahead})") == ahead - 1, "a barrier between each two iterations' first copies"


def test_a_convolution_staged_through_local_memory_on_nvidia_tensor_cores() -> None:
    """sm_80's rules stage a convolution's tiles too (K, the input channels, a loop of 2 inside the window's): each
    iteration of both loops copies its tiles of the (padded) input and the weights into local memory."""
    device = "PYTHON:80"
    Device._open.setdefault(device, PythonDevice(device, "PYTHON", tensor_cores_of="sm_80"))
    xv, wv = rounded((1, 64, 2, 32), "float16", 15), rounded((64, 64, 3, 3), "float16", 16)
    x, w = on(device, xv, "float16").realize(), on(device, wv, "float16").realize()
    with capture() as launches:
        out = x.conv2d(w, padding=1).cast(dtypes.float32).realize()
    padded = np.pad(xv, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
    want = np.zeros((1, 64, 2, 32), np.float64)
    for i in range(3):
        for j in range(3):
            want += np.einsum("nchw,oc->nohw", padded[:, :, i : i + 2, j : j + 32], wv[:, :, i, j])
    want = want.astype(np.float16).astype(np.float32)
    np.testing.assert_allclose(out.numpy(), want, rtol=2e-3, atol=2e-3 * np.abs(want).max())
    (src,) = wmma_kernels(launches)
    assert "stage0" in src and "BARRIER" in src, "the rules staged the tiles through local memory"


def _tf32(x: np.ndarray) -> np.ndarray:
    """float32 values as TF32 keeps them: 10 mantissa bits, rounded to nearest with ties away from zero (as NVIDIA's
    cvt.rna.tf32.f32), computed here on the bits with NumPy."""
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(1 << 12)) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.mark.parametrize("shape", [((32, 48), (48, 32)), ((20, 24), (24, 10)), ((2, 16, 64), (2, 64, 8))])
def test_float32_products_on_tf32_tensor_cores(shape: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    """sm_80 with TF32 chosen (target 'sm_80;tf32=1', what a CUDA device's renderer gets with TF32=1): a float32
    product runs on mma.m16n8k8.tf32, its inputs multiplied with 10 mantissa bits and summed in float32 -- the
    product of the TF32-rounded inputs, not of the inputs (whose difference is a thousand times the tolerance)."""
    device = "PYTHON:80T"
    monkeypatch.setitem(Device._open, device, PythonDevice(device, "PYTHON", tensor_cores_of="sm_80;tf32=1"))
    rng = np.random.default_rng(17)
    av, bv = (rng.standard_normal(s).astype(np.float32) for s in shape)
    with capture() as launches:
        product = (Tensor(av, device=device) @ Tensor(bv, device=device)).realize()
    out = product.numpy()
    (src,) = wmma_kernels(launches)
    assert "nv_m16n8k8_tf32_float32" in src
    want = _tf32(av).astype(np.float64) @ _tf32(bv).astype(np.float64)
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
    assert np.abs(out - av.astype(np.float64) @ bv).max() > 1e-3  # (not the full float32 product)


def test_float32_products_stay_off_tensor_cores_without_tf32() -> None:
    """Without TF32 (the default) sm_80's tensor cores take no float32 product: full float32, as PyTorch's matmul."""
    device = "PYTHON:80"
    Device._open.setdefault(device, PythonDevice(device, "PYTHON", tensor_cores_of="sm_80"))
    rng = np.random.default_rng(18)
    av, bv = rng.standard_normal((32, 48)).astype(np.float32), rng.standard_normal((48, 32)).astype(np.float32)
    with capture() as launches:
        product = (Tensor(av, device=device) @ Tensor(bv, device=device)).realize()
    out = product.numpy()
    assert not wmma_kernels(launches) and launches
    np.testing.assert_allclose(out, av.astype(np.float64) @ bv, rtol=1e-5, atol=1e-5)


def test_a_float32_convolution_and_its_gradients_on_tf32_tensor_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    """A float32 convolution, its input and weight gradients with TF32 chosen: each product on mma.m16n8k8.tf32
    (the rules' plans, the window's offsets in K), within TF32's error of PyTorch's float64 result."""
    torch = pytest.importorskip("torch")
    device = "PYTHON:80T"
    monkeypatch.setitem(Device._open, device, PythonDevice(device, "PYTHON", tensor_cores_of="sm_80;tf32=1"))
    rng = np.random.default_rng(19)
    xv, wv = (
        rng.standard_normal((2, 16, 8, 8)).astype(np.float32),
        rng.standard_normal((16, 16, 3, 3)).astype(np.float32),
    )
    gv = rng.standard_normal((2, 16, 8, 8)).astype(np.float32)
    x, w = Tensor(xv, device=device).realize(), Tensor(wv, device=device).realize()
    x.requires_grad, w.requires_grad = True, True
    y = x.conv2d(w, padding=1)
    with capture() as launches:
        out, dx, dw = (t.realize() for t in (y, *y.gradient(x, w, gradient=Tensor(gv, device=device))))
    assert len(wmma_kernels(launches)) >= 3, "the convolution and both gradients on tensor cores"
    tx, tw = (
        torch.tensor(xv, dtype=torch.float64, requires_grad=True),
        torch.tensor(wv, dtype=torch.float64, requires_grad=True),
    )
    ty = torch.nn.functional.conv2d(tx, tw, padding=1)
    ty.backward(torch.tensor(gv, dtype=torch.float64))
    for got, want in ((out, ty), (dx, tx.grad), (dw, tw.grad)):
        want = want.detach().numpy()
        np.testing.assert_allclose(got.numpy(), want, rtol=0, atol=4e-3 * np.abs(want).max())
