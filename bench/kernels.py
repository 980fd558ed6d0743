"""Single-kernel workloads: matmul, a fused elementwise chain, a full sum, softmax and a conv2d.

Every side computes the same thing from the same float32 inputs; tiny and tinygrad run lazily and are realized
and waited for inside the timed function, NumPy and PyTorch run eagerly (NumPy makes a temporary per op).
"""

from __future__ import annotations

import numpy as np

from bench.core import GBS, GFLOPS, MS, Params, Prepared, Target, Workload
from bench.frameworks import (
    random_arrays,
    tiny_done,
    tiny_upload,
    tinygrad_done,
    tinygrad_upload,
    torch,
)
from tiny.ir.config import BEAM

# ---------------------------------------------------------------- matmul: C = A @ B, N x N float32


def _matmul_inputs(params: Params) -> list[np.ndarray]:
    return random_arrays((params["N"], params["N"]), 2)


def _matmul_numpy(params: Params, device: str) -> Prepared:
    a, b = _matmul_inputs(params)
    return Prepared(lambda: a @ b)


def _matmul_torch(params: Params, device: str) -> Prepared:
    a, b = (torch.from_numpy(x) for x in _matmul_inputs(params))
    return Prepared(lambda: a @ b)


def _matmul_tiny(params: Params, device: str) -> Prepared:
    a, b = (tiny_upload(x, device) for x in _matmul_inputs(params))
    return Prepared(lambda: tiny_done(a @ b))


def _matmul_tinygrad(params: Params, device: str) -> Prepared:
    a, b = (tinygrad_upload(x) for x in _matmul_inputs(params))
    return Prepared(lambda: tinygrad_done(a @ b))


def _matmul_target(n: int) -> Target | None:
    """The issue sets a goal for N=1024 only: 0.6x NumPy as it comes, 0.8x with a BEAM search (BEAM >= 1)."""
    if n != 1024:
        return None
    return Target(">=0.8x numpy (BEAM)", "numpy", 0.8) if BEAM.value else Target(">=0.6x numpy", "numpy", 0.6)


def matmul(n: int, quick_n: int) -> Workload:
    return Workload(
        name=f"matmul{n}",
        group="matmul",
        what=f"float32 matmul of two N x N matrices, N={n}; GFLOPS = 2 N^3 / time",
        metrics=(GFLOPS,),
        full={"N": n},
        quick={"N": quick_n},
        amounts=lambda p: {"flops": 2 * p["N"] ** 3},
        setups={"tiny": _matmul_tiny, "numpy": _matmul_numpy, "torch": _matmul_torch, "tinygrad": _matmul_tinygrad},
        target=_matmul_target(n),
    )


# ---------------------------------------------------------------- elementwise: exp2((a*b + c).relu() * d - a)


def _chain_numpy(params: Params, device: str) -> Prepared:
    a, b, c, d = random_arrays((params["n"],), 4)
    return Prepared(lambda: np.exp2(np.maximum(a * b + c, 0) * d - a))


def _chain_torch(params: Params, device: str) -> Prepared:
    a, b, c, d = (torch.from_numpy(x) for x in random_arrays((params["n"],), 4))
    return Prepared(lambda: torch.exp2(torch.relu(a * b + c) * d - a))


def chain(a, b, c, d):  # tiny, tinygrad or torch tensors of one shape
    """The elementwise workload's 6 ops, for any tensor type with relu() and exp2() methods (tiny, tinygrad,
    torch; the --gpu suite runs it too)."""
    return ((a * b + c).relu() * d - a).exp2()


def _chain_tiny(params: Params, device: str) -> Prepared:
    a, b, c, d = (tiny_upload(x, device) for x in random_arrays((params["n"],), 4))
    return Prepared(lambda: tiny_done(chain(a, b, c, d)))


def _chain_tinygrad(params: Params, device: str) -> Prepared:
    a, b, c, d = (tinygrad_upload(x) for x in random_arrays((params["n"],), 4))
    return Prepared(lambda: tinygrad_done(chain(a, b, c, d)))


ELEMENTWISE = Workload(
    name="elementwise",
    group="elementwise",
    what="exp2((a*b + c).relu() * d - a) over n float32 (6 ops, 4 inputs); GB/s = 4 inputs + 1 output, once each",
    metrics=(GBS,),
    full={"n": 16 * 1024 * 1024},
    quick={"n": 64 * 1024},
    amounts=lambda p: {"bytes": 5 * 4 * p["n"]},
    setups={"tiny": _chain_tiny, "numpy": _chain_numpy, "torch": _chain_torch, "tinygrad": _chain_tinygrad},
    target=Target(">=1x torch", "torch", 1.0),
)

# ---------------------------------------------------------------- sum: every element of a vector


def _sum_numpy(params: Params, device: str) -> Prepared:
    (a,) = random_arrays((params["n"],), 1)
    return Prepared(lambda: a.sum())


def _sum_torch(params: Params, device: str) -> Prepared:
    a = torch.from_numpy(random_arrays((params["n"],), 1)[0])
    return Prepared(lambda: a.sum())


def _sum_tiny(params: Params, device: str) -> Prepared:
    a = tiny_upload(random_arrays((params["n"],), 1)[0], device)
    return Prepared(lambda: tiny_done(a.sum()))


def _sum_tinygrad(params: Params, device: str) -> Prepared:
    a = tinygrad_upload(random_arrays((params["n"],), 1)[0])
    return Prepared(lambda: tinygrad_done(a.sum()))


SUM = Workload(
    name="sum",
    group="sum",
    what="full sum of n float32 to one number; GB/s = input + output bytes",
    metrics=(GBS, MS),
    full={"n": 16 * 1024 * 1024},
    quick={"n": 64 * 1024},
    amounts=lambda p: {"bytes": 4 * p["n"] + 4},
    setups={"tiny": _sum_tiny, "numpy": _sum_numpy, "torch": _sum_torch, "tinygrad": _sum_tinygrad},
    target=Target(">=0.75x torch", "torch", 0.75),
)

# ---------------------------------------------------------------- softmax: rows x cols, along the last axis


def _softmax_numpy(params: Params, device: str) -> Prepared:
    (x,) = random_arrays((params["rows"], params["cols"]), 1)

    def run() -> np.ndarray:
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)

    return Prepared(run)


def _softmax_torch(params: Params, device: str) -> Prepared:
    x = torch.from_numpy(random_arrays((params["rows"], params["cols"]), 1)[0])
    return Prepared(lambda: torch.softmax(x, dim=-1))


def _softmax_tiny(params: Params, device: str) -> Prepared:
    x = tiny_upload(random_arrays((params["rows"], params["cols"]), 1)[0], device)
    return Prepared(lambda: tiny_done(x.softmax(-1)))


def _softmax_tinygrad(params: Params, device: str) -> Prepared:
    x = tinygrad_upload(random_arrays((params["rows"], params["cols"]), 1)[0])
    return Prepared(lambda: tinygrad_done(x.softmax(-1)))


SOFTMAX = Workload(
    name="softmax",
    group="softmax",
    what="softmax of a rows x cols float32 matrix along the last axis (NumPy: max, exp, sum, divide)",
    metrics=(MS,),
    full={"rows": 4096, "cols": 4096},
    quick={"rows": 256, "cols": 256},
    setups={"tiny": _softmax_tiny, "numpy": _softmax_numpy, "torch": _softmax_torch, "tinygrad": _softmax_tinygrad},
    target=Target(">=1x torch", "torch", 1.0),
)

# ---------------------------------------------------------------- conv2d: 3x3, padding 1, NCHW


def _conv_inputs(params: Params) -> tuple[np.ndarray, np.ndarray]:
    b, c, hw = params["batch"], params["channels"], params["hw"]
    rng = np.random.default_rng(0)
    return rng.random((b, c, hw, hw), dtype=np.float32), rng.random((c, c, 3, 3), dtype=np.float32)


def _conv_numpy(params: Params, device: str) -> Prepared:
    """im2col + matmul: the padded input's 3x3 windows copied into a (B*H*W, C*9) matrix, times the weight."""
    x, w = _conv_inputs(params)
    b, c, hw = x.shape[0], x.shape[1], x.shape[2]
    weight = w.reshape(c, c * 9).T

    def run() -> np.ndarray:
        padded = np.pad(x, ((0, 0), (0, 0), (1, 1), (1, 1)))
        windows = np.lib.stride_tricks.sliding_window_view(padded, (3, 3), axis=(2, 3))  # B, C, H, W, 3, 3
        cols = windows.transpose(0, 2, 3, 1, 4, 5).reshape(b * hw * hw, c * 9)  # the copy im2col makes
        return (cols @ weight).reshape(b, hw, hw, c).transpose(0, 3, 1, 2)

    return Prepared(run, note="im2col + matmul")


def _conv_torch(params: Params, device: str) -> Prepared:
    x, w = (torch.from_numpy(a) for a in _conv_inputs(params))
    return Prepared(lambda: torch.nn.functional.conv2d(x, w, padding=1))


def _conv_tiny(params: Params, device: str) -> Prepared:
    x, w = (tiny_upload(a, device) for a in _conv_inputs(params))
    return Prepared(lambda: tiny_done(x.conv2d(w, padding=1)))


def _conv_tinygrad(params: Params, device: str) -> Prepared:
    x, w = (tinygrad_upload(a) for a in _conv_inputs(params))
    return Prepared(lambda: tinygrad_done(x.conv2d(w, padding=1)))


CONV2D = Workload(
    name="conv2d",
    group="conv2d",
    what="conv2d, batch x C -> C channels, hw x hw, 3x3, padding 1, no bias; GFLOPS = 2 B C C H W 9 / time",
    metrics=(GFLOPS,),
    full={"batch": 8, "channels": 64, "hw": 56},
    quick={"batch": 1, "channels": 16, "hw": 16},
    amounts=lambda p: {"flops": 2 * p["batch"] * p["channels"] ** 2 * p["hw"] ** 2 * 9},
    setups={"tiny": _conv_tiny, "numpy": _conv_numpy, "torch": _conv_torch, "tinygrad": _conv_tinygrad},
    target=Target(">=0.5x torch", "torch", 0.5),
)
