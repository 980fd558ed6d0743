"""COMGR (libamd_comgr) as the other way from LLVM IR to a code object: kernels of the AMDGPU renderer compiled by it
(in a child process) and read back, its refusals, and the choice between it and the system's toolchain; and that
COMGR is never loaded into this process, where it would clash with another LLVM (PoCL's). Skips where COMGR is not
installed (Debian: apt install libamd-comgr2, whose COMGR 2.4 knows up to gfx90a and gfx1036, none of RDNA3/4 or
CDNA3/4; the tests use the targets it knows)."""

from __future__ import annotations

import numpy as np
import pytest

from tiny.codegen import render_for
from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer.amdgpu import AMDGPURenderer
from tiny.ir.device import CompileError, DeviceUnavailable
from tiny.ir.uop import Ops
from tiny.runtime.amd import compiler as amd_compiler
from tiny.runtime.amd.comgr import COMGRCompiler, find_comgr, load_comgr
from tiny.runtime.amd.elf import read_code_object

WANTED = ("gfx942", "gfx90a", "gfx1100", "gfx1030")  # the first two COMGR knows of CDNA and of RDNA


def test_no_library_is_a_plain_reason() -> None:
    with pytest.raises(DeviceUnavailable, match=r"no COMGR: none of libnocomgr\.so loads .*apt install libamd-comgr2"):
        load_comgr(("libnocomgr.so",))


def targets() -> list[str]:
    comgr = find_comgr()
    if comgr is None:
        pytest.skip("COMGR (libamd_comgr) is not installed")
    cdna = next(t for t in WANTED[:2] if comgr.knows(t))
    rdna = next(t for t in WANTED[2:] if comgr.knows(t))
    return [cdna, rdna]


def test_renderer_kernels_compile_and_read_back() -> None:
    tensor = pytest.importorskip("tiny.tensor", reason="the kernels come from tiny-tensor ops")
    a = tensor.Tensor(np.ones((8, 1024), np.float32))
    h = tensor.Tensor(np.ones(256, np.float16))
    cases = [(a * 2 + 1, None), (a.sum(1), [Opt(OptOps.GROUP, 1, 64)]), (h * h + h, None)]
    for target in targets():
        comp = COMGRCompiler(target)
        wave = 64 if target.startswith("gfx9") else 32
        for out, opts in cases:
            (ast,) = [i.ast for i in out.schedule() if i.ast.op is Ops.SINK]
            r = render_for(ast, AMDGPURenderer(target), opts)
            co = read_code_object(comp.compile(r.src), expect_target=target)
            (k,) = co.kernels.values()
            assert k.name == r.kernel.name and k.wavefront_size == wave
            assert (k.group_segment_size > 0) == (opts is not None)


def test_refusals() -> None:
    target = targets()[0]
    with pytest.raises(CompileError, match=r"(?s)COMGR codegen failed for gfx.*expected type"):
        COMGRCompiler(target).compile("define void @x( {")
    with pytest.raises(DeviceUnavailable, match=r"COMGR .* does not know gfx999"):
        COMGRCompiler("gfx999")


def test_comgr_stays_out_of_this_process() -> None:
    targets()
    with open("/proc/self/maps") as maps:
        assert "libamd_comgr" not in maps.read()


def test_amdgpu_compiler_falls_back_to_comgr(monkeypatch: pytest.MonkeyPatch) -> None:
    target = targets()[0]
    monkeypatch.setattr(amd_compiler, "find_toolchain", lambda: None)
    assert isinstance(amd_compiler.amdgpu_compiler(target), COMGRCompiler)
    with pytest.raises(DeviceUnavailable, match=r"no LLVM toolchain .*; and COMGR .* does not know gfx999"):
        amd_compiler.amdgpu_compiler("gfx999")
