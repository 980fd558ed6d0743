"""The CUDA device: what it says where it cannot start (everywhere), and, on a machine with an NVIDIA GPU, kernels
run and checked against NumPy with each renderer (CUDA C and PTX), timing, copies between devices and TinyJit's
replays through a CUDA graph. The hardware tests skip, with the reason, where no GPU opens."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tiny.codegen import Kernel, Opt, OptOps, get_program
from tiny.codegen.opt.heuristic import hand_opts
from tiny.ir.device import Device, DeviceUnavailable, available
from tiny.ir.dtypes import dtypes
from tiny.runtime.nv import cuda
from tiny.tensor import Tensor
from tiny.tensor.jit import TinyJit
from tiny.tensor.realize import capture


def _why_not() -> str | None:
    try:
        Device["CUDA"]
        return None
    except DeviceUnavailable as e:
        assert str(e).startswith("CUDA: ") and "python -m tiny.ir.device" in str(e)
        return e.reason  # the bare reason, as the listing gives it


WHY_NOT = _why_not()
gpu = pytest.mark.skipif(WHY_NOT is not None, reason=f"no CUDA GPU here: {WHY_NOT}")
RENDERERS = ["CUDA", "CUDA:PTX"]

# ---------------------------------------------------------------- everywhere


def test_the_reason_names_the_missing_piece() -> None:
    if WHY_NOT is None:
        pytest.skip("CUDA starts here")
    try:
        cuda.library()
    except DeviceUnavailable as e:
        assert "no NVIDIA driver" in str(e) and "libcuda.so.1" in str(e)
        assert "no NVIDIA driver" in str(WHY_NOT)
        return
    assert any(w in str(WHY_NOT) for w in ("GPU", "NVRTC", "sm_", "driver")), WHY_NOT


def test_the_device_listing_says_why() -> None:
    (status,) = [s for s in available() if s.name == "CUDA"]
    assert status.ok == (WHY_NOT is None)
    if WHY_NOT is not None:
        assert "DeviceUnavailable" in status.reason and str(WHY_NOT) in status.reason
    listing = subprocess.run([sys.executable, "-m", "tiny.ir.device"], capture_output=True, text=True, check=True)
    (line,) = [ln for ln in listing.stdout.splitlines() if ln.split()[:1] == ["CUDA"]]
    assert ("no" in line.split()[1]) == (WHY_NOT is not None), line


def test_both_renderers_are_taken_and_ptx_is_named() -> None:
    assert cuda.CUDADevice.renderers == ("CUDA", "PTX")
    assert Device.canonicalize("cuda:1:ptx") == "CUDA:1:PTX" and Device.canonicalize("CUDA:CUDA") == "CUDA"


def test_an_old_gpu_is_refused_plainly(monkeypatch: pytest.MonkeyPatch) -> None:
    old = cuda.GPU(0, 0, "Tesla P100", (6, 0), 1024, (1024, 1024, 64), 49152, 16 << 30)
    monkeypatch.setattr(cuda, "gpus", lambda: (old,))
    with pytest.raises(DeviceUnavailable, match=r"Tesla P100 is sm_60; tiny's CUDA runtime needs sm_70"):
        cuda.choose_gpu(0)
    with pytest.raises(DeviceUnavailable, match=r"CUDA:3 does not exist: this machine has 1 GPU"):
        cuda.choose_gpu(3)
    monkeypatch.setattr(cuda, "gpus", lambda: ())
    with pytest.raises(DeviceUnavailable, match="sees no GPU"):
        cuda.choose_gpu(0)


# ---------------------------------------------------------------- with a GPU


@gpu
@pytest.mark.parametrize("device", RENDERERS)
def test_kernels_compute_what_numpy_does(device: str) -> None:
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((65, 33)).astype(np.float32), rng.standard_normal((33, 70)).astype(np.float32)
    ta, tb = Tensor(a, device=device), Tensor(b, device=device)
    np.testing.assert_allclose((ta @ tb).numpy(), a @ b, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(ta.exp2().sum(axis=1).numpy(), np.exp2(a).sum(axis=1), rtol=1e-5)
    np.testing.assert_allclose(ta.sin().numpy(), np.sin(a), atol=2e-6)
    h, a16 = ta.cast(dtypes.float16), a.astype(np.float16).astype(np.float64)
    # each of the two ops may round to float16 (PTX's f16 arithmetic) or only the result (CUDA C computes in float):
    # within half an ulp of each rounded value of the exact answer
    exact, square = a16 * a16 + a16, a16 * a16
    np.testing.assert_array_less(np.abs((h * h + h).numpy() - exact), (np.abs(square) + np.abs(exact)) * 2**-11 + 1e-7)
    i = Tensor(np.array([-7, 7, 5, -(2**31)], np.int32), device=device)
    j = Tensor(np.array([2, -2, 0, -1], np.int32), device=device)
    # floor division as in PyTorch; a zero divisor gives 0 and MIN // -1 wraps (no trap)
    assert (i // j).tolist() == [-4, -4, 0, -(2**31)] and (i % j).tolist() == [1, -1, 0, 0]


@gpu
@pytest.mark.parametrize("device", RENDERERS)
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_matmuls_staged_with_asynchronous_copies(device: str, dtype: str) -> None:
    """The rules' plan with STAGE 1: the tiles copied by cp.async a K step ahead, against NumPy; also from a matrix
    that starts one value into its buffer (every 16-byte run misaligned: each copied value by value instead)."""
    dt, rng = dtypes.from_name(dtype), np.random.default_rng(1)
    a, b = rng.standard_normal((256, 320)).astype(np.float32), rng.standard_normal((320, 384)).astype(np.float32)
    flat = Tensor(np.concatenate([[0.0], a.ravel()]).astype(np.float32), device=device).cast(dt).realize()
    tb = Tensor(b, device=device).cast(dt).realize()
    want = flat[1:].cast(dtypes.float32).numpy().reshape(256, 320) @ tb.cast(dtypes.float32).numpy()
    dev = Device[device]
    for x in (Tensor(a, device=device).cast(dt).realize(), flat[1:].reshape(256, 320)):
        (item,) = (x @ tb).cast(dtypes.float32).schedule()
        rules = hand_opts(Kernel(item.ast, dev.renderer.caps))
        prog = get_program(item.ast, dev, [*rules[:-1], Opt(OptOps.STAGE, rules[-1].axis, 1)])
        assert "cp.async" in prog.src, "the tiles were copied asynchronously"
        bufs = [buf.ensure_allocated().opaque for buf in item.buffers]
        dev.load(prog)(*bufs, global_size=prog.global_size, local_size=prog.local_size)
        got = np.frombuffer(item.buffers[0].as_bytes(), np.float32).reshape(want.shape)
        np.testing.assert_allclose(got, want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@gpu
@pytest.mark.parametrize("device", RENDERERS)
def test_a_convolution_staged_on_tensor_cores(device: str) -> None:
    """A 3 x 3 fp16 convolution of 64 channels: the rules stage its tiles (K's loop inside the window's), against
    NumPy."""
    rng = np.random.default_rng(2)
    x, w = (
        rng.standard_normal((2, 64, 8, 32)).astype(np.float32),
        rng.standard_normal((64, 64, 3, 3)).astype(np.float32),
    )
    tx, tw = (Tensor(a, device=device).cast(dtypes.float16).realize() for a in (x, w))
    x16, w16 = tx.cast(dtypes.float32).numpy(), tw.cast(dtypes.float32).numpy()
    with capture() as launches:
        got = tx.conv2d(tw, padding=1).cast(dtypes.float32).realize()
    assert any("stage0" in launch.program.src for launch in launches if launch.program is not None)
    padded = np.pad(x16, ((0, 0), (0, 0), (1, 1), (1, 1))).astype(np.float64)
    want = sum(
        np.einsum("nchw,oc->nohw", padded[:, :, i : i + 8, j : j + 32], w16[:, :, i, j])
        for i in range(3)
        for j in range(3)
    )
    np.testing.assert_allclose(got.numpy(), want, rtol=2e-2, atol=2e-2 * np.abs(want).max())


@gpu
def test_a_launch_can_be_timed() -> None:
    dev = Device["CUDA"]
    x = Tensor.ones(1 << 20, device="CUDA").contiguous().realize()
    (item,) = (x * 2).schedule()
    prog = get_program(item.ast, dev)
    runner = dev.load(prog)
    out = Tensor.empty(1 << 20, device="CUDA").realize()
    seconds = runner(
        out._buffer().opaque, x._buffer().opaque, global_size=prog.global_size, local_size=prog.local_size, wait=True
    )
    assert seconds is not None and seconds > 0
    assert out.numpy()[:4].tolist() == [2.0] * 4


@gpu
def test_copies_between_gpus_and_the_host() -> None:
    x = np.arange(10_000, dtype=np.float32)
    t = Tensor(x, device="CUDA")
    assert np.array_equal(t.to("CPU").numpy(), x)
    try:
        Device["CUDA:1"]
    except DeviceUnavailable as e:
        pytest.skip(f"one GPU: {e}")
    assert np.array_equal((t.to("CUDA:1") + 1).numpy(), x + 1)


@gpu
@pytest.mark.parametrize("device", RENDERERS)
def test_tinyjit_replays_through_a_cuda_graph(device: str) -> None:
    w = Tensor(np.arange(16, dtype=np.float32).reshape(4, 4), device=device).realize()
    step = TinyJit(lambda x: ((x @ w).relu() + 1).realize())
    keep = []
    for i in range(4):
        x = np.full((2, 4), i - 1.5, np.float32)
        keep.append(Tensor(x, device=device))
        np.testing.assert_allclose(step(keep[-1]).numpy(), np.maximum(x @ w.numpy(), 0) + 1)
    (rec,) = step.recordings.values()
    assert isinstance(rec.graph, cuda.CUDAGraph)
