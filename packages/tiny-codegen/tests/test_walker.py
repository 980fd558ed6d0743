"""The render walker (tiny.codegen.renderer.walker): fresh names, the blocks open, inlining, and every renderer's table
of rules against the device op set."""

from __future__ import annotations

import pytest

from tiny.codegen.renderer.amdgpu import AMDGPURenderer
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.codegen.renderer.cuda import CUDARenderer
from tiny.codegen.renderer.hip import HIPRenderer
from tiny.codegen.renderer.llvmir import LLVMRenderer
from tiny.codegen.renderer.opencl import OpenCLRenderer
from tiny.codegen.renderer.ptx import PTXRenderer
from tiny.codegen.renderer.walker import Walk, WalkingRenderer, use_counts
from tiny.codegen.renderer.wgsl import WGSLRenderer
from tiny.ir.dtypes import dtypes
from tiny.ir.spec import DEVICE_OPS
from tiny.ir.uop import Ops, UOp

i32 = dtypes.int32
RENDERERS = [CRenderer, OpenCLRenderer, CUDARenderer, HIPRenderer, LLVMRenderer, AMDGPURenderer, PTXRenderer]


def test_fresh_names_count_per_prefix_or_by_a_shared_count() -> None:
    w = Walk([])
    assert [w.fresh("alu"), w.fresh("alu"), w.fresh("acc"), w.fresh("alu")] == ["alu0", "alu1", "acc0", "alu2"]
    assert w.given("alu") == 3 and w.given("acc") == 1 and w.given("val") == 0
    w = Walk([], first=1)
    assert [w.fresh("loop", "L"), w.fresh("done", "L"), w.fresh("%r")] == ["loop1", "done2", "%r1"]
    assert w.given("L") == 2 and w.given("%r") == 1


def test_an_expression_read_once_is_inlined_up_to_the_depth() -> None:
    x = UOp(Ops.DEFINE_VAR, i32, arg=("x", 0, 9))
    a = x + x.const_like(1)
    b = a * x.const_like(2)  # reads a once
    c = b + b  # reads b twice
    uops = [x, x.const_like(1), a, x.const_like(2), b, c]
    assert use_counts(uops)[b] == 2 and use_counts(uops, {Ops.MUL})[a] == 2
    w = Walk(uops, inline_depth=2)
    w.names[x] = "x"
    assert w.expression(a, "(x+1)", lambda n: f"int {n} = (x+1);") == "(x+1)"  # read once, depth 1: inlined
    w.names[a] = "(x+1)"
    assert w.expression(b, "((x+1)*2)", lambda n: f"int {n} = ((x+1)*2);") == "alu0"  # read twice: named
    assert w.lines == ["  int alu0 = ((x+1)*2);"] and w.inlined == {a}
    deep = Walk(uops, inline_depth=1)
    assert deep.expression(a, "(x+1)", lambda n: f"int {n} = (x+1);") == "alu0"  # depth 1 is not below 1


def _loop_kernel(close: Ops) -> list[UOp]:
    end = UOp.const(i32, 4)
    r = UOp.range(end, 0)
    cond = UOp(Ops.CMPLT, dtypes.bool, (r, UOp.const(i32, 2)))
    if_ = UOp(Ops.IF, src=(cond,))
    closing = [UOp(Ops.ENDIF, src=(if_,)), UOp(Ops.ENDRANGE, src=(r,))]
    if close is Ops.ENDRANGE:  # the loop closed while the IF inside it is open
        closing.reverse()
    return [end, r, UOp.const(i32, 2), cond, if_, *closing]


def test_blocks_close_innermost_first_and_indent_the_body() -> None:
    src = CRenderer().render("k", _loop_kernel(Ops.ENDIF))
    assert "  for (int ridx0 = 0; ridx0 < 4; ridx0++) {\n    if ((ridx0<2)) {\n    }\n  }" in src


@pytest.mark.parametrize("cls", [CRenderer, WGSLRenderer, LLVMRenderer, PTXRenderer])
def test_a_block_closed_out_of_order_is_refused(cls: type[WalkingRenderer]) -> None:
    with pytest.raises(ValueError, match="ENDRANGE does not close the block opened last"):
        cls().render("k", _loop_kernel(Ops.ENDRANGE))


@pytest.mark.parametrize("cls", [*RENDERERS, WGSLRenderer])
def test_every_rule_names_a_method_for_a_device_op(cls: type[WalkingRenderer]) -> None:
    assert set(cls.rules) <= DEVICE_OPS
    for op, name in cls.rules.items():
        assert callable(getattr(cls, name, None)), f"{cls.__name__}: the rule of {op.name} names no method {name}"


@pytest.mark.parametrize("cls", RENDERERS)
def test_the_renderers_with_vectors_have_a_rule_for_every_device_op(cls: type[WalkingRenderer]) -> None:
    """... but COPY_ASYNC, which only a renderer declaring asynchronous copies (RendererCaps.async_copy) is given."""
    optional = set() if cls().caps.async_copy else {Ops.COPY_ASYNC}
    assert set(cls.rules) == DEVICE_OPS - optional


def test_wgsl_has_a_rule_for_every_device_op_but_vectors_and_tensor_cores() -> None:
    assert DEVICE_OPS - set(WGSLRenderer.rules) == {Ops.VECTORIZE, Ops.GEP, Ops.WMMA, Ops.COPY_ASYNC}


def test_an_op_without_a_rule_is_refused_by_name() -> None:
    v = UOp(Ops.DEFINE_VAR, dtypes.float32.vec(2), arg=("v", 0, 1))
    with pytest.raises(NotImplementedError, match="WGSLRenderer cannot render GEP"):
        WGSLRenderer().walk(Walk([UOp(Ops.GEP, dtypes.float32, (v,), 0)]))
