"""A model run in float16 against its library's float16 and float32 runs of the same weights.

Half's tolerance is the library's own: the float32 output of the weights rounded to float16 is the reference, and
tiny's float16 output must be about as near it as the library's float16 output is: within three times its error,
or within 2e-3 of the output's largest value where the library's half is nearer than that (two of float16's epsilons,
9.8e-4: two implementations round differently), and never farther than 1e-2 of it. The result must be float16 (a
float32 that leaked into the graph would promote everything after it)."""

from __future__ import annotations

import numpy as np

from tiny.tensor import Tensor, dtypes


def half_errors(got: Tensor, want32: np.ndarray, want16: np.ndarray) -> tuple[float, float, float]:
    """tiny's largest error, the library's float16 one, and the output's largest value."""
    ours = float(np.abs(got.numpy().astype(np.float32) - want32).max())
    theirs = float(np.abs(want16.astype(np.float32) - want32).max())
    return ours, theirs, float(np.abs(want32).max())


def assert_half_close(got: Tensor, want32: np.ndarray, want16: np.ndarray, what: str = "output") -> None:
    assert got.dtype == dtypes.float16, f"{what}: computed in {got.dtype.name}, not float16"
    assert got.shape == want32.shape
    ours, theirs, scale = half_errors(got, want32, want16)
    bound = min(max(3 * theirs, 2e-3 * scale), 1e-2 * scale)
    assert ours <= bound, f"{what}: float16 error {ours:.3g}, the library's {theirs:.3g} (scale {scale:.3g})"
