"""Compile-only sweep: tiny-tensor ops scheduled as they would be for an AMD GPU, every kernel lowered with the
hand-written optimization rules for each target, rendered as AMDGPU LLVM IR and as HIP C, compiled to a code object
and read back (target, wave size, one kernel with the kernel's name and its buffers as global_buffer arguments).
Nothing runs: there is no AMD GPU here. Skips per target where the toolchain does not know it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from amd_helpers import TARGETS, WAVE, compiler

pytest.importorskip("tiny.tensor", reason="the sweep schedules tiny-tensor ops (pip install tiny-tensor)")

from tiny.codegen import render_for  # noqa: E402
from tiny.codegen.amdgpu import AMDGPURenderer  # noqa: E402
from tiny.codegen.hip import HIPRenderer  # noqa: E402
from tiny.codegen.opt import Opt, OptOps  # noqa: E402
from tiny.ir.dtypes import dtypes  # noqa: E402
from tiny.ir.uop import Ops, UOp  # noqa: E402
from tiny.runtime.amd.elf import read_code_object  # noqa: E402
from tiny.tensor import Tensor  # noqa: E402

rng = np.random.default_rng(0)


def t(*shape: int, dtype: str = "float32") -> Tensor:
    if dtype.startswith(("int", "uint")):
        return Tensor(rng.integers(-50 if dtype.startswith("int") else 0, 50, shape).astype(dtype))
    if dtype == "bool":
        return Tensor(rng.random(shape) > 0.5)
    x = Tensor(rng.standard_normal(shape).astype(np.float32))
    return x if dtype == "float32" else x.cast(dtype).realize()


# each makes the tensor(s) whose kernels are compiled; inputs are realized buffers (on the machine's default device)
OPS: dict[str, Callable[[], list[Tensor]]] = {
    "add_mul": lambda: [t(33, 65) * t(33, 65) + 1.5],
    "math_f32": lambda: [t(256).exp2() + t(256).log2() + t(256).sqrt() + t(256).sin()],
    "math_f16": lambda: [(t(256, dtype="float16") * t(256, dtype="float16")).exp2() + 1],
    "math_bf16": lambda: [t(256, dtype="bfloat16") * t(256, dtype="bfloat16") + t(256, dtype="bfloat16").sqrt()],
    "math_f64": lambda: [t(64, dtype="float64") * t(64, dtype="float64") / 3 + t(64, dtype="float64").sqrt()],
    "transcendental_f64": lambda: [
        t(64, dtype="float64").sin() + t(64, dtype="float64").exp2() - t(64, dtype="float64").log2()
    ],
    "transcendental_f16": lambda: [t(64, dtype="float16").sin() * t(64, dtype="float16").log2()],
    "casts": lambda: (
        [x.cast(dtypes.float16) for x in [t(64), t(64, dtype="int32"), t(64, dtype="bfloat16"), t(64, dtype="float64")]]
        + [
            t(64, dtype="float16").cast(dtypes.bfloat16),
            t(64).cast(dtypes.int8),
            t(64, dtype="bool").cast(dtypes.float32),
        ]
        + [t(64, dtype="uint8").cast(dtypes.float64), t(64, dtype="float64").cast(dtypes.int64)]
    ),
    "bitcast": lambda: [t(64).bitcast(dtypes.int32), t(64, dtype="float16").bitcast(dtypes.int16)],
    "int_ops": lambda: [(t(64, dtype="int32") // 7) % t(64, dtype="int32") ^ (t(64, dtype="int32") << 2)],
    "int64_div": lambda: [t(64, dtype="int64") // t(64, dtype="int64")],
    "where_mask": lambda: [(t(40, 40) > 0).where(t(40, 40), t(40, 40) * 2)],
    "compare": lambda: [(t(64) < t(64)) & (t(64, dtype="int32") != 3)],
    "sum_rows": lambda: [t(64, 256).sum(1)],
    "sum_cols": lambda: [t(256, 64).sum(0)],
    "sum_all": lambda: [t(4096).sum()],
    "max_mean": lambda: [t(32, 100).max(1), t(32, 100).mean(0)],
    "softmax": lambda: [t(16, 128).softmax(-1)],
    "matmul": lambda: [t(128, 128) @ t(128, 128)],
    "matmul_f16": lambda: [t(64, 64, dtype="float16") @ t(64, 64, dtype="float16")],
    "matmul_odd": lambda: [t(17, 33) @ t(33, 9)],
    "conv2d": lambda: [t(2, 3, 16, 16).conv2d(t(4, 3, 3, 3), padding=1)],
    "cumsum": lambda: [t(8, 100).cumsum(1)],
    "gather": lambda: [t(50, 8)[Tensor(np.array([3, 0, 49, 7], np.int32))]],
    "argmax": lambda: [t(16, 77).argmax(1)],
    "movement": lambda: [t(12, 10).permute(1, 0).pad(((1, 2), (0, 3))).flip(0)[2:9, 1:5] + 1],
}


def kernels(out: list[Tensor]) -> list[UOp]:
    items = out[0].schedule(*out[1:])
    asts = [i.ast for i in items if i.ast.op is Ops.SINK]
    assert asts, "the op scheduled no kernel"
    return asts


RENDERERS = {"AMDGPU": AMDGPURenderer, "HIP": HIPRenderer}


@pytest.mark.parametrize("lang", list(RENDERERS))
@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", list(OPS))
def test_every_kernel_compiles(op: str, target: str, lang: str) -> None:
    comp = compiler(target, hip=lang == "HIP")
    renderer = RENDERERS[lang](target)
    for ast in kernels(OPS[op]()):
        r = render_for(ast, renderer)
        co = read_code_object(comp.compile(r.src), expect_target=target)
        (k,) = co.kernels.values()
        assert k.name == r.kernel.name and k.wavefront_size == WAVE[target]
        n_buffers = sum(1 for u in r.uops if u.op is Ops.DEFINE_GLOBAL)
        assert [a.kind for a in k.args[:n_buffers]] == ["global_buffer"] * n_buffers
        assert k.max_flat_workgroup_size >= max(1, np.prod(r.kernel.local_size))


@pytest.mark.parametrize("lang", list(RENDERERS))
@pytest.mark.parametrize("target", TARGETS)
def test_grouped_reduction_uses_lds(target: str, lang: str) -> None:
    """A GROUP opt splits a reduction over a workgroup: partial sums meet in LDS behind a barrier."""
    comp = compiler(target, hip=lang == "HIP")
    (ast,) = kernels([t(8, 1024).sum(1)])
    r = render_for(ast, RENDERERS[lang](target), [Opt(OptOps.GROUP, 1, 64)])
    (k,) = read_code_object(comp.compile(r.src)).kernels.values()
    assert k.group_segment_size >= 64 * 4
