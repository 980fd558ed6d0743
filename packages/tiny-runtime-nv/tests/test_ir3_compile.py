"""Compile-only tests of ir3, Mesa's Adreno compiler: every kernel of the GPU compile sweep's
ops (nv_kernels.py, the kernels the CUDA and NAK sweeps compile), planned for IR3Renderer's limits, rendered as NIR
and compiled by ir3 for the Adreno a630, a660 and a730; the code read back through freedreno's disassembler. They
live beside NAK's sweep for its kernel set until tiny has a QCOM device, whose tests they become. Skipped without the
tinymesa wheel (the mesa nox session installs it)."""

from __future__ import annotations

import re

import pytest
from nv_kernels import _t, ops, render_schedule

from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer import mesa
from tiny.codegen.renderer.ir3 import GPUS, IR3Compiler, IR3Renderer
from tiny.ir.device import DeviceUnavailable

try:
    mesa.wheel_version()
except DeviceUnavailable as e:
    pytest.skip(str(e), allow_module_level=True)

ADRENOS = ("a630", "a660", "a730")
OPS = ops()
# what ir3 cannot take, refused when the kernel is rendered: NIR has no bfloat16, Adreno no float64
REFUSED = {op: "not a type of NIR's" for op in OPS if "bfloat16" in op} | {
    op: "Adreno GPUs have no float64" for op in OPS if "float64" in op or op == "double_math"
}


@pytest.mark.parametrize("gpu", ADRENOS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_kernel_compiles(op: str, gpu: str) -> None:
    if op in REFUSED:
        with pytest.raises(NotImplementedError, match=REFUSED[op]):
            render_schedule(op, OPS[op](), IR3Renderer())
        return
    kernels = render_schedule(op, OPS[op](), IR3Renderer())
    assert kernels, f"{op} scheduled no kernel"
    for k in kernels:
        shader = IR3Compiler(gpu).shader(k.src)
        lines = [line.strip() for line in shader.disassembly.splitlines() if line.strip()]
        instructions = [line for line in lines if not line.endswith(":")]  # (not the branches' labels)
        assert len(shader.code) >= 8 * len(instructions) and len(shader.code) % 8 == 0  # (64-bit instructions)
        assert "end" in lines and any(line.startswith("stg.") for line in lines), k.name


def test_grouped_reduction_meets_in_shared_memory_behind_a_barrier() -> None:
    (k,) = render_schedule("sum", _t(8, 1024).sum(1), IR3Renderer(), [Opt(OptOps.GROUP, 1, 64)])
    listing = IR3Compiler("a660").disassemble(k.src)
    assert re.search(r"\bstl\.u32\b", listing) and re.search(r"\bldl\.u32\b", listing)
    assert re.search(r"\bbar\b", listing) and re.search(r"\bldg\.u32\b", listing)


@pytest.mark.parametrize("gpu", sorted(GPUS))
def test_every_gpu_of_the_table_compiles_a_kernel(gpu: str) -> None:
    (k,) = render_schedule("add", _t(64) * 2 + 1, IR3Renderer())
    assert re.search(r"\bmul\.f\b|\bmad\.f32\b", IR3Compiler(gpu).disassemble(k.src))


def test_gpus_ir3_does_not_know_here_are_refused() -> None:
    with pytest.raises(ValueError, match=r"ir3 compiles here for the Adreno GPUs \['a630', .*\], got 'a530'"):
        IR3Compiler("a530")


def test_float64_is_refused_at_render_time() -> None:
    with pytest.raises(NotImplementedError, match=r"IR3Renderer cannot take dtypes\.float64 .*no float64"):
        render_schedule("f64", _t(8).cast("float64") + 1, IR3Renderer())
