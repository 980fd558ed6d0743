"""The machine code of compiled kernels, disassembled with the toolchain's llvm-objdump: what the renderers ask
for reaches the ISA (LDS and s_barrier for a grouped reduction, f16 instructions for half math, wide global loads
and stores for upcast elementwise kernels) on every target the toolchain knows."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile

import numpy as np
import pytest
from amd_helpers import TARGETS, compiler

pytest.importorskip("tiny.tensor", reason="the kernels come from tiny-tensor ops (pip install tiny-tensor)")

from tiny.codegen import render_for  # noqa: E402
from tiny.codegen.opt import Opt, OptOps  # noqa: E402
from tiny.codegen.renderer.amdgpu import AMDGPURenderer  # noqa: E402
from tiny.codegen.renderer.hip import HIPRenderer  # noqa: E402
from tiny.ir.uop import Ops  # noqa: E402
from tiny.runtime.amd.discovery import find_toolchain  # noqa: E402
from tiny.tensor import Tensor  # noqa: E402

RENDERERS = {"AMDGPU": AMDGPURenderer, "HIP": HIPRenderer}


def objdump() -> str:
    tc = find_toolchain()
    if tc is None:
        pytest.skip("no LLVM toolchain with the AMDGPU target")
    beside = os.path.join(os.path.dirname(os.path.realpath(shutil.which(tc.clang) or tc.clang)), "llvm-objdump")
    if os.access(beside, os.X_OK):
        return beside
    pytest.skip(f"no llvm-objdump beside {tc.clang}")


def disassemble(target: str, lang: str, out: Tensor, opts: list[Opt] | None = None) -> str:
    comp = compiler(target, hip=lang == "HIP")
    (ast,) = [i.ast for i in out.schedule() if i.ast.op is Ops.SINK]
    binary = comp.compile(render_for(ast, RENDERERS[lang](target), opts).src)
    with tempfile.NamedTemporaryFile(suffix=".co") as f:
        f.write(binary)
        f.flush()
        r = subprocess.run([objdump(), "-d", f"--mcpu={target}", f.name], capture_output=True, text=True, check=True)
    return r.stdout


def mnemonics(text: str) -> set[str]:
    return set(re.findall(r"^\s+([a-z][a-z0-9_]*)", text, re.M))


def ones(*shape: int, dtype: type = np.float32) -> Tensor:
    return Tensor(np.ones(shape, dtype))


@pytest.mark.parametrize("lang", list(RENDERERS))
@pytest.mark.parametrize("target", TARGETS)
def test_local_memory_means_lds_and_s_barrier(target: str, lang: str) -> None:
    # 128 threads: two waves even at 64 lanes (a workgroup of one wave needs no barrier, and LLVM drops it)
    ops = mnemonics(disassemble(target, lang, ones(8, 1024).sum(1), [Opt(OptOps.GROUP, 1, 128)]))
    barrier = {"s_barrier_signal", "s_barrier_wait"} if target.startswith("gfx12") else {"s_barrier"}  # RDNA4 splits it
    assert barrier <= ops, sorted(ops)
    assert any(re.match(r"ds_(write|store)", m) for m in ops), sorted(ops)
    assert any(re.match(r"ds_(read|load)", m) for m in ops), sorted(ops)


@pytest.mark.parametrize("lang", list(RENDERERS))
@pytest.mark.parametrize("target", TARGETS)
def test_no_barrier_without_local_memory(target: str, lang: str) -> None:
    ops = mnemonics(disassemble(target, lang, ones(64, 64) * 2 + 1))
    assert not any(m.startswith(("s_barrier", "ds_")) for m in ops), sorted(ops)


@pytest.mark.parametrize("lang", list(RENDERERS))
@pytest.mark.parametrize("target", TARGETS)
def test_half_math_is_f16_instructions(target: str, lang: str) -> None:
    h = ones(256, dtype=np.float16)
    ops = mnemonics(disassemble(target, lang, h * h + h))
    f16 = [m for m in ops if re.fullmatch(r"v_(pk_|dual_)?(mul|add|fma|fmac)_f16(_e32|_e64)?", m)]
    assert f16, f"no f16 arithmetic among {sorted(ops)}"
    assert not any(re.fullmatch(r"v_cvt_f32_f16.*", m) for m in ops), "half math went through float"


@pytest.mark.parametrize("lang", list(RENDERERS))
@pytest.mark.parametrize("target", TARGETS)
def test_global_loads_and_stores_are_wide(target: str, lang: str) -> None:
    ops = mnemonics(disassemble(target, lang, ones(64, 64) * ones(64, 64)))
    assert any(re.fullmatch(r"global_load_(b128|dwordx4)", m) for m in ops), sorted(ops)
    assert any(re.fullmatch(r"global_store_(b128|dwordx4)", m) for m in ops), sorted(ops)


FUSED = re.compile(r"v_(pk_|dual_)?(fma|fmac|mad|mac|fmamk|fmaak)_(f32|f64|legacy_f32)(_e32|_e64)?")


@pytest.mark.parametrize("lang", list(RENDERERS))
@pytest.mark.parametrize("target", TARGETS)
def test_only_a_reductions_accumulator_is_fused(target: str, lang: str) -> None:
    """x * x - y is a multiply and a subtraction (two roundings) in every kernel, as in the kernel that computed y:
    HIP's clang contracted it into an fma by default, so a value computed again rounded otherwise and x * x - y was
    not 0 where y held x * x. A reduction's accumulator still takes its products as fused multiply-adds."""
    x, y = Tensor(np.linspace(-2, 2, 4096, dtype=np.float32)), Tensor(np.ones(4096, np.float32))
    elementwise = mnemonics(disassemble(target, lang, x * x - y))
    assert not any(FUSED.fullmatch(m) for m in elementwise), sorted(elementwise)
    reduction = mnemonics(disassemble(target, lang, ones(64, 64) @ ones(64, 64)))
    assert any(FUSED.fullmatch(m) for m in reduction), sorted(reduction)
