"""float64 exp2, log2 and sin for AMD GPUs (tiny.codegen.renderer.amdmath), checked on this host: the LLVM IR and the C
versions are compiled for the CPU with clang, called through ctypes and compared with NumPy, in ulps, over wide
ranges and the special values (the same IR and C go to the GPU). Skips where no clang is on PATH."""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from collections.abc import Callable
from functools import cache
from pathlib import Path

import numpy as np
import pytest

from tiny.codegen.renderer import amdmath

rng = np.random.default_rng(0)
SPECIAL = [0.0, -0.0, np.inf, -np.inf, np.nan]
INPUTS = {
    "exp2": np.concatenate([rng.uniform(-1080, 1030, 4000), rng.uniform(-3, 3, 4000), [1023.9, 1024, -1074, -1100]]),
    "log2": np.concatenate([np.exp(rng.uniform(-700, 700, 4000)), rng.uniform(0.5, 2, 4000), [1, 5e-324, -1.0]]),
    "sin": np.concatenate([rng.uniform(-10, 10, 4000), rng.uniform(-1e6, 1e6, 4000), [np.pi, np.pi / 2, 1e-300]]),
}
REFERENCE: dict[str, Callable[[np.ndarray], np.ndarray]] = {"exp2": np.exp2, "log2": np.log2, "sin": np.sin}
MAX_ULPS = {"exp2": 2, "log2": 4, "sin": 3}


@cache
def library(tmp: str, language: str) -> ctypes.CDLL:
    cc = next((c for c in ("clang-19", "clang") if shutil.which(c)), None)
    if cc is None:
        pytest.skip("no clang on PATH to compile the functions for this host")
    if language == "ir":
        src = "\n".join(amdmath.IR_DECLARES) + "\n" + "".join(amdmath.ir_function(f) for f in amdmath.FUNCTIONS)
        src += "".join(
            f"define double @call_{f}(double %x) {{\n  %r = call double @{amdmath.ir_name(f)}(double %x)\n"
            "  ret double %r\n}\n"
            for f in amdmath.FUNCTIONS
        )
    else:
        src = "".join(amdmath.c_function(f) for f in amdmath.FUNCTIONS)
        src += "".join(f"double call_{f}(double x) {{ return {amdmath.ir_name(f)}(x); }}\n" for f in amdmath.FUNCTIONS)
    path = Path(tmp, f"amdmath.{'ll' if language == 'ir' else 'c'}")
    path.write_text(src)
    so = path.with_suffix(f".{language}.so")
    lang = ["-x", "ir"] if language == "ir" else ["-ffp-contract=off"]
    r = subprocess.run([cc, "-O2", "-shared", "-fPIC", *lang, str(path), "-o", str(so), "-lm"], capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    return ctypes.CDLL(str(so))


@pytest.mark.parametrize("language", ["ir", "c"])
@pytest.mark.parametrize("fn", amdmath.FUNCTIONS)
def test_against_numpy(fn: str, language: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    lib = library(str(tmp_path_factory.getbasetemp()), language)
    call = getattr(lib, f"call_{fn}")
    call.restype, call.argtypes = ctypes.c_double, [ctypes.c_double]
    x = np.concatenate([INPUTS[fn], SPECIAL])
    with np.errstate(all="ignore"):
        want = REFERENCE[fn](x)
    got = np.array([call(float(v)) for v in x])
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want), err_msg=f"NaN where NumPy has none (or not) for {fn}")
    exact = ~np.isfinite(want) | (want == 0)
    np.testing.assert_array_equal(got[exact & ~np.isnan(want)], want[exact & ~np.isnan(want)])
    close = ~exact
    ulps = np.abs(got[close] - want[close]) / np.spacing(np.abs(want[close]))
    assert ulps.max() <= MAX_ULPS[fn], f"{fn} ({language}) is {ulps.max()} ulps off at x = {x[close][ulps.argmax()]}"


def test_constants_are_what_they_claim() -> None:
    assert amdmath.PIO2_1 + amdmath.PIO2_2 == amdmath.PIO2_1 and abs(amdmath.PIO2_2) < 1e-16
    assert amdmath.PIO2_1 == np.pi / 2 and amdmath.TWO_OVER_PI == 2 / np.pi
    assert amdmath.EXP2_COEFFS[:2] == [1.0, np.log(2)] and amdmath.COS_COEFFS[1] == -0.5
    with pytest.raises(ValueError, match="no float64 cos"):
        amdmath.c_function("cos")
