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
from tiny.codegen.opt import Opt, OptOps  # noqa: E402
from tiny.codegen.renderer.amdgpu import AMDGPURenderer  # noqa: E402
from tiny.codegen.renderer.hip import HIPRenderer  # noqa: E402
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
    "activations": lambda: [t(300).gelu() + t(300).sigmoid() * t(300).tanh() + t(300).silu() - t(300).softplus()],
    "pow_log_exp": lambda: [t(128).abs().pow(t(128)) + t(128).exp() + t(128).abs().log() + t(128).erf()],
    "rounding": lambda: [t(128).floor() + t(128).ceil() + t(128).round() + t(128).trunc() + t(128).sign()],
    "int8_uint8": lambda: [t(96, dtype="int8") * 3 + t(96, dtype="int8"), t(96, dtype="uint8") // 5],
    "bool_logic": lambda: [(t(64) > 0).logical_xor(t(64) < 0.5).logical_not() | (t(64, dtype="bool"))],
    "var_std": lambda: [t(16, 200).var(1), t(16, 200).std(0)],
    "layer_norm": lambda: [t(8, 64).layer_norm((64,))],
    "logsumexp": lambda: [t(8, 300).logsumexp(1)],
    "max_pool": lambda: [t(1, 3, 32, 32).max_pool2d(2)],
    "avg_pool": lambda: [t(1, 3, 31, 31).avg_pool2d(3, stride=2)],
    "conv_transpose": lambda: [t(1, 4, 8, 8).conv_transpose2d(t(4, 2, 3, 3), stride=2)],
    "batched_matmul_bf16": lambda: [t(4, 32, 48, dtype="bfloat16") @ t(4, 48, 16, dtype="bfloat16")],
    "one_hot_arange": lambda: [Tensor(np.array([0, 3, 9, 2], np.int32)).one_hot(10) + Tensor.arange(10)],
    "triu_tril": lambda: [t(20, 20).triu(1) + t(20, 20).tril(-2)],
    "attention": lambda: [t(2, 4, 16, 32).scaled_dot_product_attention(t(2, 4, 16, 32), t(2, 4, 16, 32))],
    "cat_repeat": lambda: [t(5, 7).cat(t(3, 7), dim=0).repeat(2, 1)],
    "topk_sort": lambda: [*t(4, 33).topk(5, axis=1)],
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


@pytest.mark.parametrize("target", TARGETS)
def test_both_languages_give_one_argument_layout(target: str) -> None:
    """A runtime packs a kernel's arguments the same way whichever renderer made it: buffers, then int32 variables."""
    llvm, hip = compiler(target), compiler(target, hip=True)
    for op in ("add_mul", "softmax", "gather", "conv2d"):
        for ast in kernels(OPS[op]()):
            layouts = []
            for comp, renderer in ((llvm, AMDGPURenderer(target)), (hip, HIPRenderer(target))):
                (k,) = read_code_object(comp.compile(render_for(ast, renderer).src)).kernels.values()
                layouts.append([(a.offset, a.size, a.kind) for a in k.args if not a.kind.startswith("hidden_")])
            assert layouts[0] == layouts[1], f"{op}: {layouts}"
            assert all(kind == "global_buffer" and size == 8 for _, size, kind in layouts[0])
