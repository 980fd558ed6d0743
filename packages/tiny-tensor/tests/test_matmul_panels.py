"""Big matrix products on the CPU read B from a copy in panels (the scheduler's choice:
tiny.ir.schedule.layout.panel_width): one more kernel, the same values, the same gradients; small ones, odd widths,
integer products and devices with workgroups read B in place."""

from __future__ import annotations

import numpy as np
import pytest

from tiny.codegen.lower import kernel_name
from tiny.ir.device import Device
from tiny.ir.schedule.layout import PANEL_MIN_B, PANEL_MIN_ROWS, panel_width
from tiny.tensor import Tensor, dtypes

rng = np.random.default_rng(0)
CPU = "CPU"  # panels are for devices without workgroups: these tests pin the CPU, whatever DEVICE says


def _arr(*shape: int, dtype: type = np.float32) -> np.ndarray:
    return rng.standard_normal(shape).astype(dtype)


def _kernels(t: Tensor) -> list[str]:
    return [kernel_name(item.ast) for item in t.schedule()]


def test_big_product_reads_b_from_panels() -> None:
    a, b = _arr(64, 512), _arr(512, 512)
    out = Tensor(a, device=CPU) @ Tensor(b, device=CPU)
    w = panel_width(CPU, dtypes.float32, 64, 512, 512)  # two of the host's vectors: 16 floats on AVX2, 32 on AVX-512
    n = 512 // w
    assert _kernels(out) == [f"E_{n}_512_{w}", f"r_64_{n}_{w}_512"], f"B copied into {n} panels of {w} columns first"
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "a_shape, b_shape",
    [
        ((2, 64, 512), (512, 512)),  # a batch of A against one B: B is copied once, not per batch
        ((64, 512), (3, 512, 512)),  # one A against a batch of B
        ((2, 1, 32, 512), (3, 512, 512)),  # broadcast batch dims on both sides
    ],
)
def test_batched_and_broadcast_products(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> None:
    a, b = _arr(*a_shape), _arr(*b_shape)
    out = Tensor(a, device=CPU) @ Tensor(b, device=CPU)
    kernels = _kernels(out)
    assert len(kernels) == 2 and kernels[0].startswith("E_"), kernels
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)


def test_float64_product_uses_panels_of_its_own_width() -> None:
    a, b = _arr(64, 512, dtype=np.float64), _arr(512, 512, dtype=np.float64)
    width = panel_width("CPU", dtypes.float64, 64, 512, 512)
    assert width > 0
    out = Tensor(a, device=CPU) @ Tensor(b, device=CPU)
    assert len(_kernels(out)) == 2
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-10, atol=1e-10)


def test_a_float16_b_is_copied_into_float16_panels() -> None:
    """A float16 weight times float32 activations (a float16 model's prompt): its panels are float16, half the bytes
    of a float32 copy (the copy of a 1B model's 5632 x 2048 weight was 46 MB a product), widened as the product reads
    them."""
    from tiny.ir.uop import Ops

    a, b = _arr(64, 512), _arr(512, 1024, dtype=np.float16)
    widened = Tensor(np.ascontiguousarray(b.T), device=CPU).cast("float32")  # (as tiny.nn.gguf reads an F16 matrix)
    for out in (Tensor(a, device=CPU) @ Tensor(b, device=CPU), Tensor(a, device=CPU).linear(widened)):
        items = [i for i in out.schedule() if i.ast.op is Ops.SINK]
        assert len(items) == 2
        assert items[0].buffers[0].dtype == dtypes.float16 and items[0].buffers[0].size == 512 * 1024  # (the panels)
        np.testing.assert_allclose(out.numpy(), a @ b.astype(np.float32), rtol=1e-4, atol=1e-3)


def test_gradients_through_the_panels() -> None:
    a, b, g = _arr(64, 512), _arr(512, 512), _arr(64, 512)
    ta, tb = Tensor(a, device=CPU, requires_grad=True), Tensor(b, device=CPU, requires_grad=True)
    ((ta @ tb) * Tensor(g, device=CPU)).sum().backward()
    assert ta.grad is not None and tb.grad is not None
    np.testing.assert_allclose(ta.grad.numpy(), g @ b.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ g, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize(
    "a_shape, b_shape, dtype, why",
    [
        ((64, 128), (128, 128), np.float32, "B fits in cache"),
        ((8, 512), (512, 512), np.float32, "too few rows of A to pay for the copy"),
        ((64, 8192), (8192, 9), np.float32, "9 columns: a vector's padding would be most of them"),
        ((64, 512), (512, 512), np.int32, "integer products"),
    ],
)
def test_products_that_read_b_in_place(
    a_shape: tuple[int, ...], b_shape: tuple[int, ...], dtype: type, why: str
) -> None:
    a, b = (rng.integers(-4, 4, s).astype(dtype) for s in (a_shape, b_shape))
    out = Tensor(a, device=CPU) @ Tensor(b, device=CPU)
    assert len(_kernels(out)) == 1, why
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)


def test_columns_that_are_no_whole_panels_are_padded_to_them() -> None:
    """B's columns padded with zeros to whole panels of one vector (an attention head of 40 in vectors of 16, where
    the product took vectors of 8): C is computed in the padded width and cut back; the same values and gradients."""
    lanes = Device[CPU].renderer.caps.vector_lanes(dtypes.float32)
    m = 10 * lanes - 1  # one column short of whole vectors, and of whole pairs of them
    assert panel_width(CPU, dtypes.float32, 64, m, 1024) == lanes
    a, b, g = _arr(64, 1024), _arr(1024, m), _arr(64, m)
    ta, tb = Tensor(a, device=CPU, requires_grad=True), Tensor(b, device=CPU, requires_grad=True)
    out = ta @ tb
    assert out.shape == (64, m)
    # B padded, then copied into panels; the product; the target cut from its padded width
    assert _kernels(out) == [f"E_1024_{m + 1}", f"E_10_1024_{lanes}", f"r_64_10_{lanes}_1024", f"E_64_{m}"]
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-4, atol=1e-3)
    (out * Tensor(g, device=CPU)).sum().backward()
    assert ta.grad is not None and tb.grad is not None
    np.testing.assert_allclose(ta.grad.numpy(), g @ b.T, rtol=1e-4, atol=1e-3)
    np.testing.assert_allclose(tb.grad.numpy(), a.T @ g, rtol=1e-4, atol=1e-3)


def test_a_weight_that_fits_the_cache_is_read_from_panels_too() -> None:
    """An attention projection of a UNet (8192 x 320 @ 320 x 320) and a 256 x 256 weight: B's rows, 1 KB apart,
    fall in a few of the L1's sets and evict each other, so B is copied into panels though it fits the cache."""
    for rows, k, m in ((8192, 320, 320), (1024, 256, 256)):
        assert panel_width(CPU, dtypes.float32, rows, m, k) > 0, (rows, k, m)
    assert PANEL_MIN_B <= 256 * 256


def test_panel_rule() -> None:
    assert panel_width("CPU", dtypes.float32, PANEL_MIN_ROWS, 512, PANEL_MIN_B // 512) % 2 == 0
    assert panel_width("CPU", dtypes.float32, PANEL_MIN_ROWS - 1, 512, 1024) == 0
    assert panel_width("CPU", dtypes.float32, 1024, 512, PANEL_MIN_B // 512 - 1) == 0
    assert panel_width("CPU", dtypes.float16, 1024, 1024, 1024) == 0
    assert panel_width("PYTHON", dtypes.float32, 1024, 1024, 1024) == 0, "a device with workgroups tiles on its own"
