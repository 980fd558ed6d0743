"""Every kernel of a sweep of tensor ops rendered as a NIR compute shader, after the hand-written
rules' actions and after none; each passes Mesa's nir_validate (which aborts the process, printing what is wrong,
where a shader is malformed). Compile-only: no back end runs them here. Skipped without the tinymesa wheel."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest

from tiny.codegen.program import render_for
from tiny.codegen.renderer import mesa
from tiny.codegen.renderer.nir import NIRRenderer, serialized
from tiny.ir.device import DeviceUnavailable
from tiny.tensor import Tensor

try:
    mesa.wheel_version()
except DeviceUnavailable as e:
    pytest.skip(str(e), allow_module_level=True)

_rng = np.random.default_rng(0)
A = _rng.random((4, 8), dtype=np.float32)
B = _rng.random((8, 3), dtype=np.float32)
I32 = np.arange(32, dtype=np.int32).reshape(4, 8)
U8 = np.arange(32, dtype=np.uint8).reshape(4, 8)
IMG, W = _rng.random((1, 1, 6, 6), dtype=np.float32), _rng.random((2, 1, 3, 3), dtype=np.float32)

OPS: dict[str, Callable[[], Tensor]] = {
    "exp": lambda: Tensor(A).exp(),
    "log": lambda: Tensor(A).log(),
    "sin": lambda: Tensor(A).sin(),
    "sqrt": lambda: Tensor(A).sqrt(),
    "max": lambda: Tensor(A).max(1),
    "matmul": lambda: Tensor(A) @ Tensor(B),
    "softmax": lambda: Tensor(A).softmax(1),
    "idiv_mod": lambda: Tensor(I32) // 3 + Tensor(I32) % 5,
    "shifts": lambda: (Tensor(I32) << 2) + (Tensor(I32) >> 1),
    "uint8_shift": lambda: Tensor(U8) >> 3,
    "float_to_int": lambda: Tensor(A).cast("int32"),
    "float16": lambda: Tensor(A).cast("float16") * 2,
    "float64": lambda: Tensor(A).cast("float64").sqrt(),
    "int64": lambda: Tensor(I32).cast("int64") * 3,
    "where": lambda: (Tensor(A) > 0.5).where(Tensor(A), 0),
    "bitcast": lambda: Tensor(A).bitcast("int32"),
    "argmax": lambda: Tensor(A).argmax(1),
    "cumsum": lambda: Tensor(A).cumsum(1),
    "conv2d": lambda: Tensor(IMG).conv2d(Tensor(W)),
    "pad": lambda: Tensor(A).pad(((1, 1), (2, 0))) + 1,
}


@pytest.mark.parametrize("name", OPS)
def test_every_kernel_renders_to_valid_nir(name: str) -> None:
    items = OPS[name]().schedule()
    assert items
    for item in items:
        for opts in (None, []):
            r = render_for(item.ast, NIRRenderer(), opts)
            assert r.src.startswith("shader: MESA_SHADER_COMPUTE") and serialized(r.src)
