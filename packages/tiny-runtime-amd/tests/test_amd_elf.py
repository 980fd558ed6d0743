"""The code-object reader on code objects the toolchain here builds from hand-written LLVM IR: kernarg layout,
LDS and scratch sizes, wave size per target, descriptors against metadata, segments and relocations; and the
code objects it refuses. Skips per target where no clang knows it (LLVM 19 has no gfx950)."""

from __future__ import annotations

import struct

import pytest
from amd_helpers import TARGETS, WAVE, compile_ir

from tiny.ir.device import CompileError
from tiny.runtime.amd.elf import (
    KCP_ENABLE_WAVEFRONT_SIZE32,
    PF_R,
    PF_X,
    CodeObjectError,
    KernelArg,
    KernelDescriptor,
    read_code_object,
)

LDS_FLOATS = 96

# two buffers, an int and a double: kernarg offsets 0, 8, 16 and 24 (the double aligned to 8)
KERNEL = f"""
@lds = internal addrspace(3) global [{LDS_FLOATS} x float] undef, align 16
define amdgpu_kernel void @scale(ptr addrspace(1) noalias %out, ptr addrspace(1) noalias %in, i32 %n, double %s)
    "amdgpu-flat-work-group-size"="1,{LDS_FLOATS}" {{
entry:
  %i = call i32 @llvm.amdgcn.workitem.id.x()
  %src = getelementptr float, ptr addrspace(1) %in, i32 %i
  %v = load float, ptr addrspace(1) %src
  %slot = getelementptr float, ptr addrspace(3) @lds, i32 %i
  store float %v, ptr addrspace(3) %slot
  fence syncscope("workgroup") release
  call void @llvm.amdgcn.s.barrier()
  fence syncscope("workgroup") acquire
  %j = sub i32 {LDS_FLOATS - 1}, %i
  %other = getelementptr float, ptr addrspace(3) @lds, i32 %j
  %w = load float, ptr addrspace(3) %other
  %nf = sitofp i32 %n to float
  %sf = fptrunc double %s to float
  %m = fmul float %w, %nf
  %r = fmul float %m, %sf
  %dst = getelementptr float, ptr addrspace(1) %out, i32 %i
  store float %r, ptr addrspace(1) %dst
  ret void
}}

define amdgpu_kernel void @second(ptr addrspace(1) %out) {{
  store i32 7, ptr addrspace(1) %out
  ret void
}}

declare i32 @llvm.amdgcn.workitem.id.x()
declare void @llvm.amdgcn.s.barrier()
"""

# a table of pointers in global memory: the linker leaves an R_AMDGPU_RELATIVE64 for the loader (hidden symbols) or
# an R_AMDGPU_ABS64 against a symbol (default visibility), which a loader without a symbol table cannot apply
TABLE = """
@x = {vis} addrspace(1) global [4 x float] zeroinitializer, align 16
@tbl = {vis} addrspace(1) global ptr addrspace(1) @x, align 8
define amdgpu_kernel void @k(ptr addrspace(1) %a) {{
  %p = load ptr addrspace(1), ptr addrspace(1) @tbl
  %v = load float, ptr addrspace(1) %p
  store float %v, ptr addrspace(1) %a
  ret void
}}
"""


@pytest.fixture(scope="module", params=TARGETS)
def target(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture(scope="module")
def image(target: str) -> bytes:
    return compile_ir(KERNEL, target)


def test_kernarg_layout_matches_the_parameters(image: bytes, target: str) -> None:
    co = read_code_object(image, expect_target=target)
    assert co.target == target and co.code_object_version >= 4
    assert set(co.kernels) == {"scale", "second"}
    k = co.kernels["scale"]
    plain = [(a.offset, a.size, a.kind) for a in k.args if not a.kind.startswith("hidden_")]
    assert plain == [(0, 8, "global_buffer"), (8, 8, "global_buffer"), (16, 4, "by_value"), (24, 8, "by_value")]
    assert [a.name for a in k.args[:4]] == ["out", "in", "n", "s"]
    assert k.kernarg_size >= 32 and k.kernarg_align >= 8
    assert co.kernels["second"].args[0] == KernelArg(0, 8, "global_buffer", "out", "global")


def test_lds_size_and_wave_size(image: bytes, target: str) -> None:
    co = read_code_object(image)
    k = co.kernels["scale"]
    assert k.group_segment_size == LDS_FLOATS * 4
    assert co.kernels["second"].group_segment_size == 0
    assert k.private_segment_size == 0
    assert k.wavefront_size == WAVE[target]
    assert k.max_flat_workgroup_size == LDS_FLOATS
    assert k.sgpr_count > 0 and k.vgpr_count > 0


def test_descriptor_agrees_with_metadata(image: bytes, target: str) -> None:
    co = read_code_object(image)
    for k in co.kernels.values():
        kd = KernelDescriptor.decode(k.descriptor)
        assert kd == k.kd
        assert kd.group_segment_fixed_size == k.group_segment_size
        assert kd.kernarg_size == k.kernarg_size
        assert bool(kd.kernel_code_properties & KCP_ENABLE_WAVEFRONT_SIZE32) == (WAVE[target] == 32)
        assert k.code_vaddr == k.descriptor_vaddr + kd.kernel_code_entry_byte_offset
        assert kd.workgroup_ids_enabled[0] or k.name == "second"
        assert 0 < kd.user_sgpr_count <= 16 and kd.workitem_id_dims >= 1
        assert k.descriptor_vaddr % 64 == 0  # the CP wants descriptors 64-byte aligned


def test_segments_and_loading(image: bytes) -> None:
    co = read_code_object(image)
    code = [s for s in co.segments if s.flags & PF_X]
    assert len(code) == 1 and code[0].flags & PF_R
    assert co.load_size == max(s.vaddr + s.memsz for s in co.segments)
    loaded = co.loaded_image(base=0x7F0000000000)
    assert len(loaded) == co.load_size
    k = co.kernels["scale"]
    assert loaded[k.descriptor_vaddr : k.descriptor_vaddr + 64] == k.descriptor
    s = code[0]
    assert loaded[s.vaddr : s.vaddr + s.filesz] == image[s.offset : s.offset + s.filesz]


def test_wrong_target_is_refused(image: bytes, target: str) -> None:
    other = "gfx942" if WAVE[target] == 32 else "gfx1100"
    with pytest.raises(CodeObjectError, match=f"code object is for {target}.*expected {other}"):
        read_code_object(image, expect_target=other)


def test_relative_relocations_are_applied_at_load() -> None:
    image = compile_ir(TABLE.format(vis="hidden"))
    co = read_code_object(image)
    ((where, addend),) = co.relative_relocations
    base = 0x100000000
    loaded = co.loaded_image(base)
    assert struct.unpack_from("<Q", loaded, where)[0] == base + addend
    assert struct.unpack_from("<Q", co.loaded_image(0), where)[0] == addend


def test_symbol_relocations_are_refused() -> None:
    # the compiler reads back each code object it makes: the reader's refusal is the compile error
    with pytest.raises(CompileError, match=r"not loadable: relocation type 3 .*only R_AMDGPU_RELATIVE64"):
        compile_ir(TABLE.format(vis=""))


def _patched(image: bytes, at: int, data: bytes) -> bytes:
    return image[:at] + data + image[at + len(data) :]


def test_descriptor_that_disagrees_is_refused(image: bytes) -> None:
    co = read_code_object(image)
    k = co.kernels["scale"]
    (seg,) = [s for s in co.segments if s.vaddr <= k.descriptor_vaddr < s.vaddr + s.filesz]
    at = seg.offset + k.descriptor_vaddr - seg.vaddr
    with pytest.raises(CodeObjectError, match="descriptor's group segment size is 4096, the metadata's 384"):
        read_code_object(_patched(image, at, struct.pack("<I", 4096)))
    wave_bit = struct.pack("<H", k.kd.kernel_code_properties ^ KCP_ENABLE_WAVEFRONT_SIZE32)
    with pytest.raises(CodeObjectError, match="wavefront size"):
        read_code_object(_patched(image, at + 56, wave_bit))


@pytest.mark.parametrize(
    "at, data, message",
    [
        (0, b"\x7fELG", "not an ELF file"),
        (4, b"\x01", "little-endian ELF64"),
        (7, b"\x00", "OS ABI 64"),
        (18, b"\x3e\x00", "machine 224"),
        (16, b"\x01\x00", "relocatable object"),
        (8, b"\x07", "ELF ABI version 7"),
    ],
)
def test_headers_that_are_not_a_code_object_are_refused(image: bytes, at: int, data: bytes, message: str) -> None:
    with pytest.raises(CodeObjectError, match=message):
        read_code_object(_patched(image, at, data))


def test_truncated_and_empty_images_are_refused(image: bytes) -> None:
    with pytest.raises(CodeObjectError, match="ELF64 header is 64 bytes"):
        read_code_object(image[:40])
    with pytest.raises(CodeObjectError):
        read_code_object(image[: len(image) // 2])
