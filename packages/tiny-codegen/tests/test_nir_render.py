"""The NIR renderer: kernels built as NIR compute shaders through libtinymesa, checked in what nir_print_shader
prints. Skipped where the tinymesa wheel is not installed (`pip install 'tiny-tensor[mesa]'`); the loader's checks
of the wheel run everywhere."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import pytest
from kernel_helpers import make_cases, reduce, renders_with, tensor

from tiny.codegen.opt import Opt, OptOps
from tiny.codegen.renderer import mesa
from tiny.codegen.renderer.nir import SERIALIZED, NIRRenderer, serialized
from tiny.ir.device import DeviceUnavailable, RendererCaps
from tiny.ir.device import __main__ as listing
from tiny.ir.dtypes import dtypes
from tiny.ir.schedule import create_schedule

try:
    mesa.wheel_version()
    HAVE_MESA = True
except DeviceUnavailable:
    HAVE_MESA = False
needs_mesa = pytest.mark.skipif(not HAVE_MESA, reason=f"tinymesa is not installed: {mesa.INSTALL_HINT}")

CASES = make_cases()
render = renders_with(NIRRenderer())


class _GPUNIR(NIRRenderer):
    """The renderer with workgroups and shared memory, as a GPU back end (NAK, ir3) takes them."""

    caps = RendererCaps(
        language="NIR",
        has_local=True,
        has_shared=True,
        local_max=(1024, 1024, 64),
        local_total_max=256,
        shared_max=49152,
        global_max=(2**31 - 1, 65535, 65535),
        vector_width=4,
        dtypes=NIRRenderer.caps.dtypes,
    )


def _kernels(case: Any) -> list[Any]:
    return [item.ast for item in create_schedule(case.targets).items]


def _count(src: str, what: str) -> int:
    return len(re.findall(what, src))


@needs_mesa
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_every_kernel_becomes_a_compute_shader(case: Any) -> None:
    """Each kernel of the suite's cases: a compute shader of its name, an argument per buffer, its loops as NIR loops
    (the registers lowered to phis), its stores, and the serialized shader on the last line."""
    for ast in _kernels(case):
        src, kernel = render(ast)
        assert src.startswith("shader: MESA_SHADER_COMPUTE\n") and f"name: {kernel.name}\n" in src
        n_bufs = len({b for b in ast.toposort if b.op.name == "DEFINE_GLOBAL"})
        assert _count(src, r"@load_ubo \(") == n_bufs
        assert _count(src, r"@store_global \(") >= 1
        assert "@decl_reg" not in src and "@load_reg" not in src  # (lowered to SSA)
        assert _count(src, r"\bloop \{") == _count(src, r"= phi b\d+: %\d+ \(0x0\)")  # a counter from 0 per loop
        blob = serialized(src)
        assert len(blob) > 100 and src.rstrip().splitlines()[-1].startswith(SERIALIZED)


@needs_mesa
def test_a_sum_loops_over_its_input_and_accumulates_in_a_phi() -> None:
    x = tensor(4, 8)
    src, kernel = render(create_schedule([reduce(x, (1,))]).items[0].ast, [])
    assert kernel.name == "r_4_8"
    assert _count(src, r"\bloop \{") == 2 and _count(src, r"\bbreak\b") == 2
    assert _count(src, r"\bfadd\b") == 1 and _count(src, r"@load_global \(") == 1
    assert re.search(r"32 +%\d+ = phi b\d+: %\d+ \(0x0\), b\d+: %\d+", src)  # the accumulator, from 0.0


@needs_mesa
def test_integer_division_guards_a_zero_divisor_and_a_padded_load_is_an_if() -> None:
    src = "\n".join(render(ast)[0] for case in CASES if case.name == "int_div_mod" for ast in _kernels(case))
    assert "idiv" in src and "irem" in src and "ieq" in src and "bcsel" in src
    src = "\n".join(render(ast, [])[0] for case in CASES if case.name == "padded_alu" for ast in _kernels(case))
    assert re.search(r"if %\d+ \{", src) and "@load_global" in src and "phi" in src


@needs_mesa
def test_workgroups_shared_memory_and_barriers() -> None:
    """A sum split over a workgroup (GROUP): lanes are local invocation ids, partial sums go through shared
    memory (its size in the shader's info) between barriers."""
    x = tensor(4, 256)
    ast = create_schedule([reduce(x, (1,))]).items[0].ast
    src, kernel = renders_with(_GPUNIR())(ast, [Opt(OptOps.GROUP, 1, 16), Opt(OptOps.LOCAL, 0, 2)])
    assert tuple(kernel.local_size) == (2, 16, 1)
    assert "workgroup_size: 2, 16, 1" in src
    assert re.search(r"shared_size: \d+", src)
    assert "@load_local_invocation_id" in src and "@load_workgroup_id" in src
    assert "@store_shared" in src and "@load_shared" in src
    assert (
        "@barrier (execution_scope=WORKGROUP, memory_scope=WORKGROUP, mem_semantics=ACQ|REL, mem_modes=shared)" in src
    )


@needs_mesa
@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.float64, dtypes.int8, dtypes.uint16, dtypes.int64])
def test_dtypes_keep_their_width(dtype: Any) -> None:
    x = tensor(8, dtype=dtype)
    src, _ = render(create_schedule([reduce(x, (0,))]).items[0].ast)
    bits = dtype.itemsize * 8
    assert re.search(rf"\n +{bits}(x\d+)? +%\d+ = @load_global", src), src


@needs_mesa
def test_bfloat16_is_refused_at_render_time() -> None:
    x = tensor(8, dtype=dtypes.bfloat16)
    with pytest.raises(NotImplementedError, match=r"NIRRenderer cannot take dtypes.bfloat16 .*not a type of NIR's"):
        render(create_schedule([reduce(x, (0,))]).items[0].ast)


def test_serialized_refuses_other_sources() -> None:
    with pytest.raises(ValueError, match="not a NIR renderer's source"):
        serialized("void E_4(float* a) {}\n")


def test_another_mesa_is_refused_naming_both_versions() -> None:
    mesa.check_version("25.2.7.2")
    with pytest.raises(DeviceUnavailable, match=r"tinymesa 25\.3\.1\.0 carries Mesa 25\.3\.1, .*Mesa 25\.2\.7's"):
        mesa.check_version("25.3.1.0")


def test_without_the_wheel_the_loader_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    with pytest.raises(
        DeviceUnavailable, match=r"tinymesa wheel, which is not installed: pip install 'tiny-tensor\[mesa\]'"
    ):
        mesa.wheel_version()
    assert "not installed" in (mesa.llvmpipe_problem() or "")


@needs_mesa
def test_llvmpipe_says_why_it_cannot_load() -> None:
    """libtinymesa_cpu.so needs LLVM 20's shared library; where it is missing, the reason names it."""
    problem = mesa.llvmpipe_problem()
    if problem is None:
        pytest.skip("libLLVM.so.20.1 is installed here: llvmpipe's library loads")
    assert "libLLVM.so.20.1" in problem


def test_the_device_listing_says_why_nir_cannot_be_used(monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m tiny.ir.device` names each installed renderer that cannot be used here, with the reason."""

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    nir = importlib.metadata.EntryPoint("NIR", "tiny.codegen.renderer.nir:NIRRenderer", "tiny.renderers")
    c = importlib.metadata.EntryPoint("C", "tiny.codegen.renderer.cstyle:CRenderer", "tiny.renderers")
    monkeypatch.setattr(listing, "renderer_entry_points", lambda: {"NIR": nir, "C": c})
    (line,) = listing.unavailable_renderers()
    assert line.startswith("  renderer NIR: no, Mesa's compilers come from the tinymesa wheel, which is not installed")
    assert "pip install 'tiny-tensor[mesa]'" in line
