"""Compiling the AMD renderers' output to an object file with a clang that knows the amdgcn target, as the AMD
runtimes do (without linking: the code object, its reader and the disassembly are tiny-runtime-amd's tests)."""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from functools import cache
from pathlib import Path

import pytest


@cache
def amdgpu_clang() -> tuple[str, frozenset[str]] | None:
    """A clang on PATH with the amdgcn target, and the processors it knows."""
    for cc in (*(f"clang-{v}" for v in range(25, 16, -1)), "clang"):
        if not shutil.which(cc):
            continue
        r = subprocess.run([cc, "-nogpulib", "--target=amdgcn-amd-amdhsa", "-print-supported-cpus"],
                           capture_output=True, text=True)  # fmt: skip
        cpus = frozenset(re.findall(r"\b(gfx[0-9a-f]+)\b", r.stdout + r.stderr))
        if "gfx1100" in cpus:
            return cc, cpus
    return None


def compile_amd(src: str, target: str, language: str) -> None:
    """Compile LLVM IR (language 'ir') or HIP C ('hip') for target; fail the test with clang's message."""
    found = amdgpu_clang()
    if found is None:
        pytest.skip("no clang on PATH knows the amdgcn target")
    cc, cpus = found
    if target not in cpus:
        pytest.skip(f"{cc} does not know {target}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp, "k.ll" if language == "ir" else "k.hip")
        path.write_text(src)
        if language == "ir":
            args = [cc, "-x", "ir", "--target=amdgcn-amd-amdhsa", f"-mcpu={target}", "-nogpulib"]
        else:
            args = [cc, "-x", "hip", f"--offload-arch={target}", "-nogpuinc", "-nogpulib", "--cuda-device-only"]
            args.append("--no-gpu-bundle-output")  # a plain object, as the runtime asks: no clang-offload-bundler
        r = subprocess.run([*args, "-O3", "-c", str(path), "-o", str(Path(tmp, "k.o"))], capture_output=True, text=True)
    assert r.returncode == 0, f"{cc} refused the {language} for {target}:\n{r.stderr}\n--- source ---\n{src}"
