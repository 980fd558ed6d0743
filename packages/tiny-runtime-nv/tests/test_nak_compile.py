"""Compile-only tests of NAK, Mesa's NVIDIA compiler: every kernel of the CUDA compile sweep's
ops (nv_kernels.py), planned for an H100's limits, rendered as NIR by NAKRenderer and compiled by NAK for sm_75,
sm_86, sm_89 and sm_90; the binary read back (shader model, workgroup size, instruction count against the code's
size, registers, shared memory and barriers) and NAK's listing of it. Nothing runs: tiny has no device that loads
NAK's output yet. Skipped without the tinymesa wheel (the mesa nox session installs it)."""

from __future__ import annotations

import re

import pytest
from nv_kernels import _t, ops, render_schedule, target

from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer import mesa
from tiny.codegen.renderer.nak import NAKCompiler, NAKRenderer, read_nak_binary
from tiny.codegen.renderer.nir import NIRRenderer
from tiny.ir.device import CompileError, DeviceUnavailable
from tiny.ir.uop import Ops

try:
    mesa.wheel_version()
except DeviceUnavailable as e:
    pytest.skip(str(e), allow_module_level=True)

ARCHS = ("sm_75", "sm_86", "sm_89", "sm_90")
OPS = ops()
# what NAK cannot take, refused when the kernel is rendered: NIR has no bfloat16, NVIDIA no float64 exp2/log2/sin
REFUSED = {op: "not a type of NIR's" for op in OPS if "bfloat16" in op} | {"double_math": "NAK has no float64 exp2"}


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("op", sorted(OPS))
def test_every_kernel_compiles(op: str, arch: str) -> None:
    if op in REFUSED:
        with pytest.raises(NotImplementedError, match=REFUSED[op]):
            render_schedule(op, OPS[op](), NAKRenderer(target(arch)))
        return
    kernels = render_schedule(op, OPS[op](), NAKRenderer(target(arch)))
    assert kernels, f"{op} scheduled no kernel"
    for k in kernels:
        shader = read_nak_binary(NAKCompiler(arch).compile(k.src))
        local = [1, 1, 1]
        for u in k.uops:
            if u.op is Ops.SPECIAL and u.arg[0].startswith("lidx"):
                local[int(u.arg[0][-1])] = u.arg[1]
        assert shader.sm == int(arch[3:]) and shader.local_size == tuple(local), k.name
        assert len(shader.code) == 16 * shader.num_instrs  # (128-bit instructions from Volta on)
        assert 4 <= shader.num_gprs <= 255 and shader.spills == 0
        assert (shader.smem_size > 0) == any(u.op is Ops.DEFINE_LOCAL for u in k.uops)
        assert shader.num_control_barriers == int(any(u.op is Ops.BARRIER for u in k.uops))


def test_grouped_reduction_meets_in_shared_memory_behind_a_barrier() -> None:
    (k,) = render_schedule("sum", _t(8, 1024).sum(1), NAKRenderer(target("sm_86")), [Opt(OptOps.GROUP, 1, 64)])
    compiler = NAKCompiler("sm_86")
    shader = read_nak_binary(compiler.compile(k.src))
    assert shader.local_size == (64, 1, 1) and shader.smem_size >= 64 * 4 and shader.num_control_barriers == 1
    listing = compiler.disassemble(k.src)
    assert re.search(r"st\.shared\.\S+ \[", listing) and re.search(r"= ld\.shared\.", listing)
    assert "bar.sync" in listing and "exit" in listing


def test_arguments_come_from_constant_buffer_0() -> None:
    """The output buffer's address at c[0x0][0x0], the input's at c[0x0][0x8] (read by ldc, or an operand of the
    address's arithmetic): the NIR renderer's argument layout."""
    (k,) = render_schedule("add", _t(64) + 1, NAKRenderer(target("sm_90")))
    listing = NAKCompiler("sm_90").disassemble(k.src)
    assert re.search(r"c\[0x0\]\[\+?0x0\]", listing) and re.search(r"c\[0x0\]\[\+?0x8\]", listing)
    assert "ld.global" in listing and "st.global" in listing and "fadd" in listing


def test_a_symbolic_kernel_reads_its_variable_after_the_buffers() -> None:
    (k,) = [k for k in render_schedule("sm", OPS["symbolic_softmax"](), NAKRenderer(target("sm_89")))][:1]
    n_buffers = sum(u.op is Ops.DEFINE_GLOBAL for u in k.uops)
    assert re.search(rf"c\[0x0\]\[\+?{hex(8 * n_buffers)}\]", NAKCompiler("sm_89").disassemble(k.src))


def test_what_nak_cannot_compile_is_a_compile_error_with_its_reason() -> None:
    """The plain NIR renderer reads arguments with load_ubo, which NAK does not take: NAK's reason is in the error."""
    (k,) = render_schedule("add", _t(64) + 1, NIRRenderer())
    with pytest.raises(CompileError, match=r"(?s)NAK could not compile the shader for sm_75:.*load_ubo.*--- NIR ---"):
        NAKCompiler("sm_75").compile(k.src)


@pytest.mark.parametrize("arch", ["sm_70", "compute_90", "90"])
def test_architectures_nak_does_not_take_are_refused(arch: str) -> None:
    with pytest.raises(ValueError, match=rf"NAK compiles for the NVIDIA architectures .*sm_75.*, got '{arch}'"):
        NAKCompiler(arch)
    with pytest.raises(ValueError, match="NAK compiles for"):
        NAKRenderer(f"arch={arch}")


def test_a_binary_that_is_not_nak_s_is_refused() -> None:
    with pytest.raises(ValueError, match="a NAK binary is a 728-byte nak_shader_info and the code, got 4 bytes"):
        read_nak_binary(b"\x7fELF")
    with pytest.raises(ValueError, match="not a NAK compute shader's binary"):
        read_nak_binary(bytes(2000))
