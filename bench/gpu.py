"""The GPU suite (`python -m bench.run --gpu`): tiny on a GPU device against PyTorch on CUDA, in the same run.

fp16 and bf16 matmul, the fused elementwise chain against the GPU's copy bandwidth measured in the run ("peak"),
softmax, layer norm, causal attention, the MNIST training step, a jitted function's cost per replayed kernel and a
jitted decode step over a symbolic cache length. tiny's sides are the CPU suite's tiny setups, run on tiny's GPU
device, except matmul (its dtype) and the row ops and attention (under TinyJit, as the elementwise chain, the MNIST
step and the decode step are: un-jitted, building and scheduling an op in Python takes longer than its kernel on a
GPU); PyTorch's run on `torch_device` and wait for it inside the timed function (torch.cuda.synchronize).
`gpu_workloads("cpu")` points PyTorch at the CPU, which is how the smoke test runs every code path here but the CUDA
graph capture on a machine without a GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from functools import partial

import numpy as np

from bench.core import GBS, MS, TFLOPS, Params, Prepared, Setup, Target, Workload
from bench.decode import DECODE_STEP, decode_torch
from bench.frameworks import random_arrays, tiny_done, tiny_upload, torch, torch_done, torch_upload
from bench.kernels import ELEMENTWISE, SOFTMAX, chain
from bench.overhead import JIT_REPLAY, SMALL
from bench.training import MNIST_STEP, torch_mnist_step
from tiny.tensor import Tensor, TinyJit, dtypes

CHECKED = 64  # the top-left CHECKED x CHECKED block of tiny's matmul is compared with NumPy's
MATMUL_RTOL = 1e-2  # of the block's largest value: fp16/bf16 inputs and output, accumulation in float32

# ---------------------------------------------------------------- matmul: C = A @ B, N x N, fp16 or bf16


def _matmul_inputs(params: Params) -> list[np.ndarray]:
    """float32 inputs, the same for both sides; each side casts them on its device."""
    return random_arrays((params["N"], params["N"]), 2)


def _matmul_tiny(params: Params, device: str) -> Prepared:
    a32, b32 = _matmul_inputs(params)
    dtype = getattr(dtypes, params["dtype"])
    a, b = (tiny_upload(x, device).cast(dtype).realize() for x in (a32, b32))
    product = (a @ b).realize()  # the kernel the timed runs use, compiled here and checked once
    got = product[:CHECKED, :CHECKED].float().numpy()
    want = a32[:CHECKED] @ b32[:, :CHECKED]
    error = float(np.abs(got - want).max() / np.abs(want).max())
    if not error <= MATMUL_RTOL:  # a wrong kernel is reported as an error, not as a figure
        raise RuntimeError(f"tiny's {params['dtype']} product is off by {error:.3g} of its largest value")
    return Prepared(lambda: tiny_done(a @ b))


def _matmul_torch(params: Params, device: str, torch_device: str) -> Prepared:
    dtype = getattr(torch, params["dtype"])
    a, b = (torch_upload(x, torch_device).to(dtype) for x in _matmul_inputs(params))
    return Prepared(lambda: torch_done(a @ b))


def _matmul(n: int, quick_n: int, dtype: str, torch_device: str) -> Workload:
    short = {"float16": "fp16", "bfloat16": "bf16"}[dtype]
    return Workload(
        name=f"gpu_matmul_{short}_{n}",
        group="gpu_matmul",
        what=f"{dtype} matmul of two N x N matrices (float32 inputs cast on the device), N={n}; TFLOPS = 2 N^3 / time",
        metrics=(TFLOPS,),
        full={"N": n, "dtype": dtype},
        quick={"N": quick_n, "dtype": dtype},
        amounts=lambda p: {"flops": 2 * p["N"] ** 3},
        setups={"tiny": _matmul_tiny, "torch": partial(_matmul_torch, torch_device=torch_device)},
        target=Target(">=0.8x torch", "torch", 0.8),  # issue 33's target
    )


# ---------------------------------------------------------------- elementwise, against the GPU's copy bandwidth


def _chain_tiny(params: Params, device: str) -> Prepared:
    """The chain under TinyJit: its one kernel replayed, as in a training loop (un-jitted, each call also pays for
    building and scheduling the six ops in Python, a fixed cost of a few hundred microseconds here)."""
    a, b, c, d = (tiny_upload(x, device) for x in random_arrays((params["n"],), 4))
    jitted = TinyJit(lambda a, b, c, d: chain(a, b, c, d).realize())
    return Prepared(lambda: tiny_done(jitted(a, b, c, d)), note="TinyJit: the fused kernel replayed")


def _chain_torch(params: Params, device: str, torch_device: str) -> Prepared:
    a, b, c, d = (torch_upload(x, torch_device) for x in random_arrays((params["n"],), 4))
    return Prepared(lambda: torch_done(chain(a, b, c, d)), note="eager: a kernel per op")


def _copy_peak(params: Params, device: str, torch_device: str) -> Prepared:
    """The GPU's bandwidth as measured here: PyTorch's device-to-device copy of copy_bytes, counting the bytes read
    and the bytes written."""
    size = params["copy_bytes"]
    src = torch.rand(size // 4, device=torch_device)
    dst = torch.empty_like(src)
    amount = f"{size / 2**30:g} GiB" if size >= 2**30 else f"{size / 2**20:g} MiB"
    note = f"PyTorch dst.copy_(src) of {amount}, bytes read + written: measured, not a datasheet figure"
    return Prepared(lambda: torch_done(dst.copy_(src)), amounts={"bytes": 2 * size}, note=note)


def _elementwise(torch_device: str) -> Workload:
    return Workload(
        name="gpu_elementwise",
        group="gpu_elementwise",
        what=f"{ELEMENTWISE.what}; ratio against peak, the GPU's copy bandwidth measured in the run",
        metrics=(GBS,),
        full={"n": 64 * 2**20, "copy_bytes": 2**30},
        quick={"n": 2**20, "copy_bytes": 4 * 2**20},
        amounts=ELEMENTWISE.amounts,
        setups={
            "tiny": _chain_tiny,
            "torch": partial(_chain_torch, torch_device=torch_device),
            "peak": partial(_copy_peak, torch_device=torch_device),
        },
        target=Target(">=0.85x peak", "peak", 0.85),
    )


# ---------------------------------------------------------------- softmax


def _softmax_torch(params: Params, device: str, torch_device: str) -> Prepared:
    x = torch_upload(random_arrays((params["rows"], params["cols"]), 1)[0], torch_device)
    return Prepared(lambda: torch_done(torch.softmax(x, dim=-1)))


def _row_op_tiny(params: Params, device: str, op: Callable[[Tensor], Tensor]) -> Prepared:
    """A row op (softmax, layer norm) of a rows x cols matrix under TinyJit: its kernel replayed, as in a training
    loop (un-jitted, each call also builds and schedules the op in Python: on a GPU, longer than the kernel)."""
    x = tiny_upload(random_arrays((params["rows"], params["cols"]), 1)[0], device)
    jitted = TinyJit(lambda x: op(x).realize())
    return Prepared(lambda: tiny_done(jitted(x)), note="TinyJit")


def _softmax(torch_device: str) -> Workload:
    return replace(
        SOFTMAX,
        setups={
            "tiny": partial(_row_op_tiny, op=lambda x: x.softmax(-1)),
            "torch": partial(_softmax_torch, torch_device=torch_device),
        },
        name="gpu_softmax",
        group="gpu_softmax",
        what="softmax of a rows x cols float32 matrix along the last axis",
        full={"rows": 8192, "cols": 8192},
        target=Target(">=1x torch", "torch", 1.0),
    )


# ---------------------------------------------------------------- attention and layer norm


def _attention_inputs(params: Params) -> list[np.ndarray]:
    shape = (params["batch"], params["heads"], params["seq"], params["dim"])
    return random_arrays(shape, 3)


def _attention_tiny(params: Params, device: str) -> Prepared:
    """float16 query, key and value; causal attention under TinyJit, checked once against NumPy on one head."""
    arrays = _attention_inputs(params)
    q, k, v = (tiny_upload(x, device).cast(dtypes.float16).realize() for x in arrays)
    jitted = TinyJit(lambda q, k, v: q.scaled_dot_product_attention(k, v, is_causal=True).realize())
    got = jitted(q, k, v)[0, 0].float().numpy()
    a, b, c = (x[0, 0].astype(np.float16).astype(np.float64) for x in arrays)
    scores = a @ b.T / np.sqrt(a.shape[-1]) + np.triu(np.full((len(a), len(a)), -np.inf), 1)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    want = probs / probs.sum(-1, keepdims=True) @ c
    if not np.abs(got - want).max() <= 1e-2:  # a wrong kernel is reported as an error, not as a figure
        raise RuntimeError(f"tiny's attention is off by {np.abs(got - want).max():.3g}")
    return Prepared(lambda: tiny_done(jitted(q, k, v)), note="TinyJit, float16")


def _attention_torch(params: Params, device: str, torch_device: str) -> Prepared:
    q, k, v = (torch_upload(x, torch_device).half() for x in _attention_inputs(params))
    attend = torch.nn.functional.scaled_dot_product_attention
    return Prepared(lambda: torch_done(attend(q, k, v, is_causal=True)), note="scaled_dot_product_attention")


def _attention(torch_device: str) -> Workload:
    return Workload(
        name="gpu_attention",
        group="gpu_attention",
        what="causal scaled dot-product attention of float16 (batch, heads, seq, dim) query, key and value",
        metrics=(MS,),
        full={"batch": 8, "heads": 16, "seq": 2048, "dim": 64},
        quick={"batch": 1, "heads": 2, "seq": 64, "dim": 16},
        setups={"tiny": _attention_tiny, "torch": partial(_attention_torch, torch_device=torch_device)},
        target=Target(">=0.7x torch", "torch", 0.7),  # issue 33's target
    )


def _layer_norm_torch(params: Params, device: str, torch_device: str) -> Prepared:
    x = torch_upload(random_arrays((params["rows"], params["cols"]), 1)[0], torch_device)
    return Prepared(lambda: torch_done(torch.nn.functional.layer_norm(x, x.shape[-1:])))


def _layer_norm(torch_device: str) -> Workload:
    return Workload(
        name="gpu_layer_norm",
        group="gpu_softmax",
        what="layer norm (no affine) of a rows x cols float32 matrix along the last axis",
        metrics=(MS,),
        full={"rows": 8192, "cols": 8192},
        quick={"rows": 64, "cols": 256},
        setups={
            "tiny": partial(_row_op_tiny, op=lambda x: x.layer_norm(x.shape[-1:])),
            "torch": partial(_layer_norm_torch, torch_device=torch_device),
        },
        target=Target(">=1x torch", "torch", 1.0),
    )


# ---------------------------------------------------------------- the MNIST training step


def _mnist_torch(params: Params, device: str, torch_device: str) -> Prepared:
    return torch_mnist_step(params, torch_device)


def _mnist(torch_device: str) -> Workload:
    return _on_gpu(
        MNIST_STEP,
        partial(_mnist_torch, torch_device=torch_device),
        name="gpu_mnist_step",
        group="gpu_mnist",
        what=f"{MNIST_STEP.what}; tiny under TinyJit, PyTorch eager",
    )


# ---------------------------------------------------------------- a jitted function's launch cost per kernel


def _launch_torch(params: Params, device: str, torch_device: str) -> Prepared:
    """The same kernels as tiny's jit replay (x * 0.5 + 1, one kernel each: torch.add(one, x, alpha=0.5)) captured
    once in a CUDA graph and replayed; eager where PyTorch's device is not a GPU (the smoke test)."""
    kernels, calls = params["kernels"], params["calls"]
    start = torch_upload(SMALL, torch_device)
    one = torch.ones_like(start)

    def chain_of_kernels() -> object:
        x = start
        for _ in range(kernels):
            x = torch.add(one, x, alpha=0.5)
        return x

    if start.device.type != "cuda":

        def run_eagerly() -> None:
            for _ in range(calls):
                out = chain_of_kernels()
            torch_done(out)

        return Prepared(run_eagerly, units=calls * kernels, note=f"{kernels} kernels per call, eager: not a GPU")
    side = torch.cuda.Stream(device=start.device)  # warm up on a side stream before capturing, as torch asks
    side.wait_stream(torch.cuda.current_stream(start.device))
    with torch.cuda.stream(side):
        chain_of_kernels()
    torch.cuda.current_stream(start.device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = chain_of_kernels()

    def replay() -> None:
        for _ in range(calls):
            graph.replay()
        torch_done(out)

    return Prepared(replay, units=calls * kernels, note=f"{kernels} kernels per call in a torch.cuda.CUDAGraph")


def _jit_launch(torch_device: str) -> Workload:
    return _on_gpu(
        JIT_REPLAY,
        partial(_launch_torch, torch_device=torch_device),
        name="gpu_jit_launch",
        group="gpu_overhead",
        what=f"{JIT_REPLAY.what}; PyTorch: the same kernels replayed from a CUDA graph",
        target=None,
    )


def _decode(torch_device: str) -> Workload:
    return _on_gpu(
        DECODE_STEP,
        partial(decode_torch, torch_device=torch_device),
        name="gpu_decode_step",
        group="gpu_decode",
        what=f"{DECODE_STEP.what}; tiny under TinyJit with pos a Variable, PyTorch eager",
    )


def _on_gpu(cpu: Workload, torch_setup: Setup, **changes: object) -> Workload:
    """A workload of the CPU suite with its tiny side as it is (on the GPU device) and PyTorch's side on the GPU."""
    return replace(cpu, setups={"tiny": cpu.setups["tiny"], "torch": torch_setup}, **changes)


def gpu_workloads(torch_device: str = "cuda") -> tuple[Workload, ...]:
    """The GPU suite in table order, with PyTorch's sides on torch_device."""
    return (
        _matmul(4096, 64, "float16", torch_device),
        _matmul(4096, 64, "bfloat16", torch_device),
        _matmul(8192, 128, "float16", torch_device),
        _matmul(8192, 128, "bfloat16", torch_device),
        _elementwise(torch_device),
        _softmax(torch_device),
        _layer_norm(torch_device),
        _attention(torch_device),
        _mnist(torch_device),
        _jit_launch(torch_device),
        _decode(torch_device),
    )
