"""Tensor.dot4 (Ops.DOT4): each int32 as four bytes, the unsigned bytes of one times the signed bytes of the other,
summed -- NumPy's values on every device, the extremes included. Where the renderer writes the op (RendererCaps.dot4:
the CPU's C on an x86 host with VNNI) the kernel holds it a vector at a time; elsewhere the code generator writes it
out in shifts and products (the same values: every device runs these tests)."""

from __future__ import annotations

import numpy as np
import pytest
from tensor_helpers import small

from tiny.codegen.program import render_for
from tiny.codegen.renderer.cstyle import CRenderer
from tiny.ir.dtypes import dtypes
from tiny.ir.uop import Ops
from tiny.tensor import Device, Tensor


def _reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a.astype(np.int32), b.astype(np.int32))
    unsigned = np.ascontiguousarray(a).view(np.uint8).reshape(*a.shape, 4).astype(np.int32)
    signed = np.ascontiguousarray(b).view(np.int8).reshape(*b.shape, 4).astype(np.int32)
    return (unsigned * signed).sum(-1, dtype=np.int32)


def _words(shape: tuple[int, ...], seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    words = rng.integers(-(2**31), 2**31, shape, dtype=np.int64).astype(np.int32).reshape(-1)
    extremes = np.array([0, -1, -(2**31), 2**31 - 1, 0x7F7F7F7F, -0x7F7F7F80, 0x00FF00FF, 0x01010101], np.int32)
    words[: len(extremes)] = extremes[: len(words)]
    return words.reshape(shape)


def _dots(t: Tensor) -> list:
    renderer = Device[t.device].renderer
    uops = [u for item in t.schedule() if item.ast.op is Ops.SINK for u in render_for(item.ast, renderer).uops]
    return [u for u in uops if u.op is Ops.DOT4]


def test_dot4_matches_numpy(device: str) -> None:
    shape = small(device, (96, 64), (3, 8))
    a, b = _words(shape, 1), _words(shape, 2)
    out = Tensor(a, device=device).dot4(Tensor(b, device=device))
    dots = _dots(out)
    if Device[device].renderer.caps.dot4:
        assert dots and any(d.dtype.count > 1 for d in dots), "vpdpbusd a vector at a time"
    else:
        assert not dots, "written out for a renderer without DOT4"
    np.testing.assert_array_equal(out.numpy(), _reference(a, b))


def test_dot4_extremes_every_pair(device: str) -> None:
    """Every pair of bytes at their extremes: 255 x -128 four times is the most negative sum, 255 x 127 the most."""
    edges = np.array([0x00000000, 0xFFFFFFFF, 0x80808080, 0x7F7F7F7F, 0x01FF7F80], np.uint32).view(np.int32)
    a, b = edges.reshape(-1, 1), edges.reshape(1, -1)
    out = Tensor(a, device=device).dot4(Tensor(b, device=device)).numpy()
    np.testing.assert_array_equal(out, _reference(a, b))
    assert out.min() == 4 * 255 * -128 and out.max() == 4 * 255 * 127


def test_dot4_summed_in_a_reduction(device: str) -> None:
    """Inside a sum (a quantized product's block sums): int32 accumulation of DOT4s."""
    rows, k = small(device, (32, 256), (4, 8))
    a, b = _words((rows, k), 3), _words((k,), 4)
    out = Tensor(a, device=device).dot4(Tensor(b, device=device)).sum(axis=1, dtype="int32")
    np.testing.assert_array_equal(out.numpy(), _reference(a, b).sum(axis=1, dtype=np.int32))


def test_dot4_broadcasts_a_python_int(device: str) -> None:
    a = _words((small(device, 64, 8),), 5)
    out = Tensor(a, device=device).dot4(0x01010101)  # the sum of a's bytes
    np.testing.assert_array_equal(out.numpy(), a.view(np.uint8).reshape(-1, 4).astype(np.int32).sum(-1))


def _signed_reference(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a, b = np.broadcast_arrays(a.astype(np.int32), b.astype(np.int32))
    first = np.ascontiguousarray(a).view(np.int8).reshape(*a.shape, 4).astype(np.int32)
    second = np.ascontiguousarray(b).view(np.int8).reshape(*b.shape, 4).astype(np.int32)
    return (first * second).sum(-1, dtype=np.int32)


def _no_minus_128(words: np.ndarray) -> np.ndarray:
    """The words with every byte of -128 made -127 (SDOT4's b never holds -128)."""
    as_bytes = words.copy().view(np.int8)
    as_bytes[as_bytes == -128] = -127
    return as_bytes.view(np.int32)


def test_sdot4_matches_numpy(device: str) -> None:
    """Ops.SDOT4 (a quantized product's Q8_0 quants times its rounded input, both signed): NumPy's sums on every
    device, a's extremes included; the renderer's own where its caps have it (x86's psignb and pmaddubsw on AVX2),
    written out elsewhere."""
    shape = small(device, (96, 64), (3, 8))
    a, b = _words(shape, 11), _no_minus_128(_words(shape, 12))
    out = Tensor(a, device=device)._alu(Ops.SDOT4, Tensor(b, device=device))
    renderer = Device[device].renderer
    uops = [u for item in out.schedule() if item.ast.op is Ops.SINK for u in render_for(item.ast, renderer).uops]
    assert any(u.op is Ops.SDOT4 for u in uops) == renderer.caps.dot4
    np.testing.assert_array_equal(out.numpy(), _signed_reference(a, b))


@pytest.mark.parametrize("other", ["float32", "int8", "uint32"])
def test_dot4_takes_int32_only(other: str) -> None:
    with pytest.raises(TypeError, match="dot4 takes int32 tensors"):
        Tensor([1, 2], dtype="int32").dot4(Tensor([1, 2], dtype=other))
    with pytest.raises(TypeError, match="dot4 takes int32 tensors"):
        Tensor([1, 2], dtype=other).dot4(Tensor([1, 2], dtype="int32"))


@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_c_renders_vnni_where_the_target_has_it(lanes: int) -> None:
    """The C renderer with the 'vnni' feature: vpdpbusd's builtin for clang and gcc behind the compiler's own macros,
    the bytes written out otherwise; without the feature the op never reaches it (caps.dot4 off)."""
    from tiny.ir.dtypes import dtypes

    with_vnni = CRenderer(f"x86_64;vector_width={lanes};threads=1;f16,vnni")
    assert with_vnni.caps.dot4 and not CRenderer("x86_64;vector_width=16;threads=1;f16").caps.dot4  # (nor avx2)
    helper = with_vnni.dot4_helper(dtypes.int32.vec(lanes), False)
    assert f"__builtin_ia32_vpdpbusd{32 * lanes}(" in helper and f"__builtin_ia32_vpdpbusd_v{lanes}si(" in helper
    assert "(signed char)" in helper  # the lanes written out where the compiler does not target VNNI
    assert not with_vnni.caps.sdot4  # (DOT4 over offset quants there: SDOT4 takes two vpdpbusd)
    signed = with_vnni.dot4_helper(dtypes.int32.vec(lanes), True)
    assert signed.count(f"__builtin_ia32_vpdpbusd{32 * lanes}(") == 2 and "tiny_sdot4_" in signed


@pytest.mark.parametrize("signed", [False, True])
@pytest.mark.parametrize("lanes", [4, 8, 16])
def test_c_renders_byte_pairs_exactly_without_vnni(lanes: int, signed: bool, tmp_path) -> None:
    """The C renderer with the 'avx2' feature and no 'vnni' takes DOT4 too: x86's pmaddubsw and pmaddwd (SSSE3's for
    4 lanes), a's bytes split into their low 7 bits and their top bit so that no int16 pair saturates; and SDOT4
    faster (caps.sdot4): |a| times b with a's sign (psignb), one pmaddubsw. Compiled for AVX2 without VNNI and run on
    every pair of the extremes: NumPy's sums, 255 x -128 four times included (SDOT4: -128 x 127 and -128 x -127; its
    b never holds -128)."""
    import shutil
    import subprocess

    from tiny.runtime.cpu import compiler_features

    renderer = CRenderer(f"x86_64;vector_width={lanes};threads=1;f16,avx2")
    assert renderer.caps.dot4 and renderer.caps.sdot4
    vec = dtypes.int32.vec(lanes)
    helper = renderer.dot4_helper(vec, signed)
    width = "256" if lanes >= 8 else "128"
    assert f"__builtin_ia32_pmaddubsw{width}(" in helper and f"__builtin_ia32_pmaddwd{width}(" in helper
    assert (f"__builtin_ia32_psignb{width}(" in helper) == signed
    cc = shutil.which("clang-19") or shutil.which("clang") or shutil.which("gcc")
    if cc is None or "avx2" not in compiler_features(cc):
        pytest.skip("no C compiler, or no AVX2 on this host to run the byte pairs on")
    edges = np.array([0x00000000, 0xFFFFFFFF, 0x80808080, 0x7F7F7F7F, 0x01FF7F80, 0x80FF0001], np.uint32).view(np.int32)
    a, b = np.meshgrid(edges, _no_minus_128(edges) if signed else edges, indexing="ij")
    a, b = a.reshape(-1), b.reshape(-1)
    a, b = (np.resize(x, -(-len(x) // lanes) * lanes) for x in (a, b))
    t = renderer.vector_type_name(vec)
    src = (
        f"#include <stdio.h>\n{renderer.vector_typedef(vec)}{helper}"
        f"int main(void) {{\n  int a[] = {{{', '.join(map(str, a.tolist()))}}};\n"
        f"  int b[] = {{{', '.join(map(str, b.tolist()))}}};\n"
        f"  for (int i = 0; i < {len(a)}; i += {lanes}) {{\n    {t} x, y, s = {{0}};\n"
        f"    __builtin_memcpy(&x, a + i, sizeof x); __builtin_memcpy(&y, b + i, sizeof y);\n"
        f"    s = {'tiny_sdot4' if signed else 'tiny_dot4'}_{t}(s + 1, x, y);\n"
        f'    for (int j = 0; j < {lanes}; j++) printf("%d\\n", s[j]);\n  }}\n}}\n'
    )
    exe = tmp_path / "dot4"
    flags = ["-O2", "-mavx2", "-mno-avx512vnni", "-mno-avxvnni"] if "clang" in cc else ["-O2", "-mavx2"]
    subprocess.run([cc, *flags, "-x", "c", "-", "-o", str(exe)], input=src.encode(), check=True)
    got = np.array(subprocess.run([str(exe)], capture_output=True, check=True).stdout.split(), np.int64)
    want = (_signed_reference if signed else _reference)(a, b)
    np.testing.assert_array_equal(got, want.astype(np.int64) + 1)


def test_a_byte_product_is_one_tiled_kernel_over_the_threads() -> None:
    """A Q4_0 weight as words (16 rows side by side) times a decode row: the product is one kernel whose rules take a
    vector of 16 rows x 4 (DOT4 a vector at a time, its int32 sums converted a vector at a time) and split it over
    the threads (DOT4 counts as four multiply-adds: counted as one, the kernel ran on one thread)."""
    from tiny.codegen.opt.actions import OptOps
    from tiny.codegen.program import rules_actions
    from tiny.tensor.byte_blocks import ByteBlocks, byte_product

    renderer = Device["CPU"].renderer
    if not renderer.caps.dot4 or renderer.caps.vector_lanes(dtypes.int32) != 16:
        pytest.skip("the CPU's C renderer here writes no DOT4 of 16 lanes (no AVX-512 VNNI)")
    rows, k = 2048, 2048
    words = Tensor(_words((rows // 16, k // 32, 4, 16), 7))
    scales = Tensor(np.full((rows // 16, k // 32, 16), 0.01, np.float16))
    out = byte_product(Tensor(np.ones((1, k), np.float32)), ByteBlocks(words, scales, nibbles=True))
    products = [i.ast for i in out.schedule() if i.ast.op is Ops.SINK and any(u.op is Ops.DOT4 for u in i.ast.toposort)]
    assert len(products) == 1
    opts = rules_actions(products[0], renderer).opts
    upcasts = sorted(o.arg for o in opts if o.op is OptOps.UPCAST)
    assert upcasts == [4, 16] and not any(o.op is OptOps.UNROLL for o in opts), opts
    assert renderer.caps.threads < 2 or any(o.op is OptOps.THREAD for o in opts), opts
    uops = render_for(products[0], renderer).uops
    assert any(u.op is Ops.CAST and u.dtype.count == 16 and u.src[0].dtype.scalar == dtypes.int32 for u in uops)
