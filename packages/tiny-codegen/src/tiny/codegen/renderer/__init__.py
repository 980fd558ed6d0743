"""The renderers: a linearized kernel as source (or assembly) in one language.

Every renderer walks the kernel's ops the same way (`walker.py`: names, open blocks, use counts, inlining) and gives
its `rules`, a table from each op to the method that writes it in its language:

- `cstyle.py`: C for the CPU, and what the C dialects share; `opencl.py`, `cuda.py` (with `ldmatrix.py`), `hip.py`
  (with `amdmath.py`'s float64 math) are the dialects;
- `llvmir.py`: LLVM IR for the CPU; `amdgpu.py` its AMD GPU target;
- `ptx.py`: NVIDIA's PTX assembly (with `ptx_math.py`'s float64 math);
- `wgsl.py`: WebGPU's WGSL.

Devices find them through the `tiny.renderers` entry points (tiny-codegen's pyproject.toml).
"""
