"""Kernels for a GPU this machine may not have: a representative set of tiny-tensor ops, scheduled as the tensor
library does, then planned (the hand-written opts: locals, upcasts, grouped reductions), lowered, vectorized,
linearized and rendered by tiny.codegen.render_for, with a renderer made from the target string the CUDA device
would report. Nothing is compiled or run here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tiny.codegen import render_for
from tiny.codegen.opt import Opt
from tiny.ir.device import Renderer
from tiny.ir.dtypes import DType, dtypes
from tiny.ir.sint import sint
from tiny.ir.uop import Ops, UOp
from tiny.tensor import Tensor, Variable

# what an H100 reports (CUDADevice.renderer_target), with the architecture under test
LIMITS = "vector_width=4;local_max=1024,1024,64;local_total_max=1024;shared_max=49152"


def target(arch: str) -> str:
    return f"arch={arch};{LIMITS}"


@dataclass(frozen=True)
class RenderedKernel:
    op: str
    name: str
    uops: tuple[UOp, ...]
    src: str
    global_size: tuple[sint, sint, sint] = (1, 1, 1)  # workgroups (over the Variables, in a symbolic kernel)


def render_schedule(op: str, t: Tensor, renderer: Renderer, opts: list[Opt] | None = None) -> list[RenderedKernel]:
    """Every kernel of t's schedule, planned for the renderer's caps (the hand-written rules unless opts are given)
    and rendered by it, as tiny.codegen.render_for does for a renderer with no device."""
    out = []
    for item in t.schedule():
        if item.ast.op is not Ops.SINK:
            continue  # a copy
        r = render_for(item.ast, renderer, opts)
        out.append(RenderedKernel(op, r.kernel.name, tuple(r.uops), r.src, r.kernel.global_size))
    return out


def _t(*shape: int, dtype: DType = dtypes.float32, seed: int = 0) -> Tensor:
    rng = np.random.default_rng(seed)
    if dtype.is_float:
        data = rng.standard_normal(shape).astype(np.float32)
        return Tensor(data, device="CPU").cast(dtype).realize()
    if dtype == dtypes.bool:
        return Tensor(rng.standard_normal(shape) > 0, device="CPU")
    info = np.iinfo(np.dtype(dtype.fmt)) if dtype.fmt else np.iinfo(np.int32)
    data = rng.integers(max(info.min, -100), min(info.max, 100), shape)
    return Tensor(data.astype(np.dtype(dtype.fmt)), device="CPU")


def _symbolic_attention() -> Tensor:
    pos = Variable("pos", 1, 64).bind(20)
    q, k, v = _t(1, 4, 1, 16), _t(1, 4, 64, 16, seed=1), _t(1, 4, 64, 16, seed=2)
    return q.scaled_dot_product_attention(k[:, :, :pos], v[:, :, :pos])


ALL_DTYPES = [d for d in dtypes.all() if d.fmt is not None or d == dtypes.bfloat16]


def ops() -> dict[str, Callable[[], Tensor]]:
    """name -> a tensor whose schedule holds the kernels to render."""
    f32, f16, bf16 = dtypes.float32, dtypes.float16, dtypes.bfloat16
    table: dict[str, Callable[[], Tensor]] = {
        "add_mul": lambda: _t(64, 64) * _t(64, 64, seed=1) + 1.5,
        "exp_log_sin_sqrt": lambda: _t(256).exp() + _t(256).abs().log() + _t(256).sin() + _t(256).abs().sqrt(),
        "div_recip_relu": lambda: (_t(128) / (_t(128, seed=2).abs() + 1)).relu().reciprocal(),
        "maximum_nan": lambda: _t(100).maximum(_t(100, seed=3)),
        "sum_rows": lambda: _t(32, 300).sum(axis=1),
        "sum_all": lambda: _t(4096).sum(),
        "max_cols": lambda: _t(300, 32).max(axis=0),
        "mean_var": lambda: _t(16, 64).var(axis=1),
        "matmul": lambda: _t(64, 64) @ _t(64, 64, seed=1),
        "matmul_odd": lambda: _t(33, 17) @ _t(17, 9, seed=1),
        "softmax": lambda: _t(8, 100).softmax(axis=1),
        # rows whose workgroup shares their reductions (ROWS): 128 threads of 32 values each, held; a layer norm's
        # mean read inside its variance; attention's probabilities over 4 dims (16 rows: the PTX interpreter runs
        # each of their 64 threads)
        "softmax_long_rows": lambda: _t(2, 4096).softmax(axis=1),
        "layernorm_rows": lambda: _t(6, 768).layernorm(-1) * _t(768, seed=1),
        "attention_rows": lambda: (_t(1, 2, 8, 64) * 0.125).softmax(-1),
        "where_mask": lambda: (_t(64) > 0).where(_t(64, seed=1), _t(64, seed=2) * 2),
        "cumsum": lambda: _t(8, 50).cumsum(axis=1),
        "gather": lambda: _t(10, 20)[Tensor(np.array([3, 1, 9, 0]), device="CPU")],
        "pad_flip_permute": lambda: _t(6, 7).pad(((1, 2), (0, 3))).flip(0).permute(1, 0) + 1,
        "half_math": lambda: (_t(64, dtype=f16) * _t(64, dtype=f16, seed=1) + _t(64, dtype=f16)).exp(),
        "half_sum": lambda: _t(16, 128, dtype=f16).sum(axis=1),
        "half_matmul": lambda: _t(32, 32, dtype=f16) @ _t(32, 32, dtype=f16, seed=1),
        "bfloat16_math": lambda: (_t(64, dtype=bf16) * _t(64, dtype=bf16, seed=1)).sqrt() + 1,
        "bfloat16_matmul": lambda: _t(16, 16, dtype=bf16) @ _t(16, 16, dtype=bf16, seed=1),
        "int_div_mod": lambda: (_t(64, dtype=dtypes.int32) // 7) + (_t(64, dtype=dtypes.int32, seed=1) % 5),
        "int8_math": lambda: _t(64, dtype=dtypes.int8) * 3 + _t(64, dtype=dtypes.int8),
        "int64_sum": lambda: _t(8, 64, dtype=dtypes.int64).sum(axis=1),
        "bool_logic": lambda: (_t(64) > 0) & (_t(64, seed=1) < 0.5) | (_t(64, seed=2) == 0),
        "double_math": lambda: (_t(64, dtype=dtypes.float64) * 2).exp() + _t(64, dtype=dtypes.float64).sqrt(),
        # symbolic sizes: the kernels take the Variable as an integer argument
        "symbolic_softmax": lambda: _t(8, 100)[:, : Variable("n", 1, 100).bind(37)].softmax(axis=1),
        "symbolic_attention": lambda: _symbolic_attention(),
    }
    for d in ALL_DTYPES:
        if d != f32:
            table[f"cast_{d.name}_to_float32"] = lambda d=d: _t(64, dtype=d).cast(f32) + 0
            table[f"cast_float32_to_{d.name}"] = lambda d=d: (_t(64) * 50).cast(d)
    table["cast_float64_to_float16"] = lambda: _t(64, dtype=dtypes.float64).cast(f16)
    table["cast_float16_to_bfloat16"] = lambda: _t(64, dtype=f16).cast(bf16)
    table["cast_bfloat16_to_int8"] = lambda: (_t(64, dtype=bf16) * 50).cast(dtypes.int8)
    table["bitcast_float32_to_int32"] = lambda: _t(64).bitcast(dtypes.int32) + 1
    return table
