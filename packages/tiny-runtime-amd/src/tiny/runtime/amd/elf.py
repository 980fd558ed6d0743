"""Reading an AMDGPU code object (an HSA ELF shared object, as ld.lld -shared writes it) with nothing but struct.

What a runtime needs to load and launch its kernels: the PT_LOAD segments (where each part of the file goes in
GPU memory, relative to the base it is loaded at), the kernels (each function `<name>` has a 64-byte kernel
descriptor `<name>.kd` in read-only data), the code-object metadata (the NT_AMDGPU_METADATA note, a MessagePack
map: each kernel's arguments with their offsets, sizes and kinds, its kernarg segment, LDS and scratch needs,
wavefront size and register counts), and the descriptor decoded and checked against that metadata.

A code object this reader cannot vouch for is refused with a CodeObjectError saying why: not ELF64, not AMDGPU
HSA, a relocatable object that was never linked, relocations other than R_AMDGPU_RELATIVE64 (the only kind a
loader must apply, by adding the load base), metadata that disagrees with a descriptor, or another GPU target than
the one expected.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from tiny.runtime.amd.msgpack import MsgpackError, unpack


class CodeObjectError(ValueError):
    """A code object that cannot be loaded: what was expected and what was found."""


# ---------------------------------------------------------------- ELF constants (the System V ABI, AMDGPU's parts)

ELFCLASS64, ELFDATA2LSB = 2, 1
ELFOSABI_AMDGPU_HSA = 64
EM_AMDGPU = 224
ET_REL, ET_DYN = 1, 3
PT_LOAD, PT_NOTE = 1, 4
PF_X, PF_W, PF_R = 1, 2, 4
SHT_SYMTAB, SHT_RELA, SHT_NOTE, SHT_REL, SHT_DYNSYM = 2, 4, 7, 9, 11
STT_OBJECT, STT_FUNC = 1, 2
NT_AMDGPU_METADATA = 32
R_AMDGPU_NONE, R_AMDGPU_RELATIVE64 = 0, 13
# e_ident[EI_ABIVERSION] for ELFOSABI_AMDGPU_HSA: the code object version
CODE_OBJECT_VERSIONS = {1: 3, 2: 4, 3: 5, 4: 6}

EF_AMDGPU_MACH = 0xFF
# e_flags & EF_AMDGPU_MACH -> the processor (LLVM's EF_AMDGPU_MACH_AMDGCN_* values) for the GCN targets tiny knows
MACHINES = {
    0x2C: "gfx900",
    0x2F: "gfx906",
    0x30: "gfx908",
    0x3F: "gfx90a",
    0x40: "gfx940",
    0x4B: "gfx941",
    0x4C: "gfx942",
    0x4F: "gfx950",
    0x36: "gfx1030",
    0x41: "gfx1100",
    0x46: "gfx1101",
    0x47: "gfx1102",
    0x44: "gfx1103",
    0x43: "gfx1150",
    0x4A: "gfx1151",
    0x48: "gfx1200",
    0x4E: "gfx1201",
}

KERNEL_DESCRIPTOR_SIZE = 64
# kernel_code_properties bits
KCP_ENABLE_SGPR_PRIVATE_SEGMENT_BUFFER = 1 << 0
KCP_ENABLE_SGPR_DISPATCH_PTR = 1 << 1
KCP_ENABLE_SGPR_QUEUE_PTR = 1 << 2
KCP_ENABLE_SGPR_KERNARG_SEGMENT_PTR = 1 << 3
KCP_ENABLE_SGPR_DISPATCH_ID = 1 << 4
KCP_ENABLE_SGPR_FLAT_SCRATCH_INIT = 1 << 5
KCP_ENABLE_SGPR_PRIVATE_SEGMENT_SIZE = 1 << 6
KCP_ENABLE_WAVEFRONT_SIZE32 = 1 << 10
KCP_USES_DYNAMIC_STACK = 1 << 11


# ---------------------------------------------------------------- what a loader gets


@dataclass(frozen=True)
class KernelArg:
    """One kernel argument in the kernarg segment, as the metadata lists it."""

    offset: int
    size: int
    kind: str  # .value_kind: global_buffer, by_value, hidden_block_count_x ...
    name: str = ""
    address_space: str = ""  # global, local ... for pointers


@dataclass(frozen=True)
class KernelDescriptor:
    """The 64-byte kernel descriptor the dispatch packet points at, decoded."""

    group_segment_fixed_size: int
    private_segment_fixed_size: int
    kernarg_size: int
    kernel_code_entry_byte_offset: int  # from the descriptor's own address to the kernel's first instruction
    compute_pgm_rsrc3: int
    compute_pgm_rsrc1: int
    compute_pgm_rsrc2: int
    kernel_code_properties: int
    kernarg_preload: int

    @staticmethod
    def decode(raw: bytes) -> KernelDescriptor:
        if len(raw) != KERNEL_DESCRIPTOR_SIZE:
            raise CodeObjectError(f"a kernel descriptor is {KERNEL_DESCRIPTOR_SIZE} bytes, got {len(raw)}")
        group, private, kernarg = struct.unpack_from("<III", raw, 0)
        (entry,) = struct.unpack_from("<q", raw, 16)
        rsrc3, rsrc1, rsrc2 = struct.unpack_from("<III", raw, 44)
        props, preload = struct.unpack_from("<HH", raw, 56)
        return KernelDescriptor(group, private, kernarg, entry, rsrc3, rsrc1, rsrc2, props, preload)

    @property
    def wavefront_size(self) -> int:
        return 32 if self.kernel_code_properties & KCP_ENABLE_WAVEFRONT_SIZE32 else 64

    @property
    def uses_dynamic_stack(self) -> bool:
        return bool(self.kernel_code_properties & KCP_USES_DYNAMIC_STACK)

    @property
    def private_segment_enabled(self) -> bool:
        """compute_pgm_rsrc2 bit 0: the wave gets scratch memory."""
        return bool(self.compute_pgm_rsrc2 & 1)

    @property
    def user_sgpr_count(self) -> int:
        return (self.compute_pgm_rsrc2 >> 1) & 0x1F

    @property
    def workgroup_ids_enabled(self) -> tuple[bool, bool, bool]:
        return tuple(bool(self.compute_pgm_rsrc2 >> bit & 1) for bit in (7, 8, 9))  # type: ignore[return-value]

    @property
    def workitem_id_dims(self) -> int:
        """How many workitem ids (x; x, y; x, y, z) the wave's VGPRs are given: 1 to 3."""
        return ((self.compute_pgm_rsrc2 >> 11) & 3) + 1


@dataclass(frozen=True)
class KernelInfo:
    """A kernel of a code object: where its descriptor is and what its launch needs."""

    name: str
    descriptor_vaddr: int  # the `.kd` symbol's address, relative to the load base
    kernarg_size: int
    kernarg_align: int
    args: tuple[KernelArg, ...]
    group_segment_size: int  # LDS bytes, fixed part
    private_segment_size: int  # scratch bytes per work item, fixed part
    wavefront_size: int
    descriptor: bytes  # the 64 bytes as in the file
    sgpr_count: int = 0
    vgpr_count: int = 0
    max_flat_workgroup_size: int = 0
    uses_dynamic_stack: bool = False
    code_vaddr: int = 0  # the kernel's first instruction, relative to the load base

    @property
    def kd(self) -> KernelDescriptor:
        return KernelDescriptor.decode(self.descriptor)


@dataclass(frozen=True)
class Segment:
    """A PT_LOAD segment: filesz bytes of the image from offset go to vaddr (plus base); memsz - filesz zeros."""

    vaddr: int
    offset: int
    filesz: int
    memsz: int
    flags: int  # PF_R | PF_W | PF_X


@dataclass(frozen=True)
class CodeObject:
    """A code object read and checked: its target, segments, kernels and the relocations a loader applies."""

    target: str  # the processor: gfx1100, gfx942 ...
    image: bytes
    segments: tuple[Segment, ...]
    kernels: dict[str, KernelInfo]
    target_id: str = ""  # with its features as the metadata says: gfx942:sramecc+:xnack-
    code_object_version: int = 0
    relative_relocations: tuple[tuple[int, int], ...] = ()  # R_AMDGPU_RELATIVE64: (vaddr, addend)

    @property
    def load_size(self) -> int:
        """Bytes to reserve to load every segment at its vaddr from base 0."""
        return max((s.vaddr + s.memsz for s in self.segments), default=0)

    def loaded_image(self, base: int) -> bytes:
        """The load_size bytes to copy to GPU memory at address `base`: each segment at its vaddr, zeros between
        and after, and the R_AMDGPU_RELATIVE64 relocations applied (base + addend at each)."""
        out = bytearray(self.load_size)
        for s in self.segments:
            out[s.vaddr : s.vaddr + s.filesz] = self.image[s.offset : s.offset + s.filesz]
        for vaddr, addend in self.relative_relocations:
            struct.pack_into("<Q", out, vaddr, (base + addend) & 0xFFFFFFFFFFFFFFFF)
        return bytes(out)


# ---------------------------------------------------------------- reading


@dataclass(frozen=True)
class _Section:
    name: str
    type: int
    flags: int
    addr: int
    offset: int
    size: int
    link: int
    entsize: int


def read_code_object(image: bytes, expect_target: str | None = None) -> CodeObject:
    """Read and check a code object. `expect_target` ('gfx1100', or with features 'gfx942:xnack-') refuses one
    built for another GPU."""
    image = bytes(image)
    e_flags, abi_version, sections, segments = _headers(image)
    version = CODE_OBJECT_VERSIONS.get(abi_version)
    if version is None or version < 3:
        raise CodeObjectError(f"ELF ABI version {abi_version}: expected a code object of version 3 to 6")
    meta = _metadata(image, sections)
    target_id = _target_id(meta)
    processor = target_id.split(":")[0]
    mach = MACHINES.get(e_flags & EF_AMDGPU_MACH)
    if mach is not None and mach != processor:
        raise CodeObjectError(f"the ELF header says {mach} but the metadata says {target_id}")
    if expect_target is not None:
        _check_target(target_id, expect_target)
    symbols = _symbols(image, sections)
    relocations = _relocations(image, sections)
    kernels = {}
    for entry in _metadata_kernels(meta):
        info = _kernel(image, segments, symbols, entry)
        kernels[info.name] = info
    return CodeObject(processor, image, segments, kernels, target_id, version, relocations)


def _check_target(target_id: str, expected: str) -> None:
    processor, *features = target_id.split(":")
    want, *want_features = expected.split(":")
    if processor != want or any(f not in features for f in want_features):
        raise CodeObjectError(f"code object is for {target_id}, expected {expected}")


def _unpack(fmt: str, image: bytes, offset: int, what: str) -> tuple[Any, ...]:
    if offset < 0 or offset + struct.calcsize(fmt) > len(image):
        raise CodeObjectError(f"{what} at byte {offset} lies outside the {len(image)}-byte image")
    return struct.unpack_from(fmt, image, offset)


def _cstring(image: bytes, offset: int, what: str) -> str:
    end = image.find(b"\0", offset)
    if offset < 0 or offset >= len(image) or end < 0:
        raise CodeObjectError(f"{what} at byte {offset} is not a NUL-terminated string inside the image")
    return image[offset:end].decode(errors="replace")


def _headers(image: bytes) -> tuple[int, int, tuple[_Section, ...], tuple[Segment, ...]]:
    if image[:4] != b"\x7fELF":
        raise CodeObjectError(f"not an ELF file: it starts with {image[:4]!r}, expected b'\\x7fELF'")
    if len(image) < 64:
        raise CodeObjectError(f"an ELF64 header is 64 bytes, the image has {len(image)}")
    ei_class, ei_data, _, osabi, abi_version = image[4], image[5], image[6], image[7], image[8]
    if ei_class != ELFCLASS64 or ei_data != ELFDATA2LSB:
        raise CodeObjectError(f"expected a little-endian ELF64 file, got class {ei_class} and data encoding {ei_data}")
    if osabi != ELFOSABI_AMDGPU_HSA:
        raise CodeObjectError(f"expected OS ABI {ELFOSABI_AMDGPU_HSA} (AMDGPU HSA), got {osabi}")
    e_type, e_machine = _unpack("<HH", image, 16, "the ELF header")
    if e_machine != EM_AMDGPU:
        raise CodeObjectError(f"expected machine {EM_AMDGPU} (EM_AMDGPU), got {e_machine}")
    if e_type == ET_REL:
        raise CodeObjectError("a relocatable object (ET_REL), not a code object: link it with `ld.lld -shared` first")
    if e_type != ET_DYN:
        raise CodeObjectError(f"expected a shared object (ET_DYN = {ET_DYN}), got ELF type {e_type}")
    phoff, shoff, e_flags, _, phentsize, phnum, shentsize, shnum, shstrndx = _unpack(
        "<QQIHHHHHH", image, 32, "the ELF header"
    )
    segments = []
    for i in range(phnum):
        p_type, p_flags, p_offset, p_vaddr, _, p_filesz, p_memsz, _ = _unpack(
            "<IIQQQQQQ", image, phoff + i * phentsize, f"program header {i}"
        )
        if p_type != PT_LOAD:
            continue
        if p_filesz > p_memsz or p_offset + p_filesz > len(image):
            raise CodeObjectError(
                f"PT_LOAD segment {i} is malformed: {p_filesz} bytes at offset {p_offset} into {p_memsz} bytes of "
                f"memory, in a {len(image)}-byte image"
            )
        segments.append(Segment(p_vaddr, p_offset, p_filesz, p_memsz, p_flags))
    if not segments:
        raise CodeObjectError("the code object has no PT_LOAD segment: nothing to load")
    shnum = shnum if shoff else 0
    raw = [_unpack("<IIQQQQIIQQ", image, shoff + i * shentsize, f"section header {i}") for i in range(shnum)]
    names_at = raw[shstrndx][4] if raw and shstrndx < len(raw) else None
    sections = tuple(
        _Section(
            _cstring(image, names_at + s[0], f"name of section {i}") if names_at is not None else "",
            s[1],
            s[2],
            s[3],
            s[4],
            s[5],
            s[6],
            s[9],
        )
        for i, s in enumerate(raw)
    )
    return e_flags, abi_version, sections, tuple(segments)


def _notes(image: bytes, sections: tuple[_Section, ...]) -> list[tuple[str, int, bytes]]:
    """Every (owner, type, description) of the SHT_NOTE sections."""
    out = []
    for s in sections:
        if s.type != SHT_NOTE:
            continue
        pos, end = s.offset, s.offset + s.size
        while pos + 12 <= end:
            namesz, descsz, ntype = _unpack("<III", image, pos, "a note header")
            name_at = pos + 12
            desc_at = name_at + (namesz + 3) // 4 * 4
            next_at = desc_at + (descsz + 3) // 4 * 4
            if desc_at + descsz > end:
                raise CodeObjectError(f"a note in section {s.name} runs past its end")
            out.append((image[name_at : name_at + namesz].rstrip(b"\0").decode(errors="replace"), ntype,
                        image[desc_at : desc_at + descsz]))  # fmt: skip
            pos = next_at
    return out


def _metadata(image: bytes, sections: tuple[_Section, ...]) -> dict[str, Any]:
    notes = _notes(image, sections)
    found = [desc for owner, ntype, desc in notes if owner == "AMDGPU" and ntype == NT_AMDGPU_METADATA]
    if len(found) != 1:
        raise CodeObjectError(f"expected one AMDGPU metadata note (NT_AMDGPU_METADATA), found {len(found)}")
    try:
        meta = unpack(found[0])
    except MsgpackError as e:
        raise CodeObjectError(f"the AMDGPU metadata note is not MessagePack: {e}") from None
    if not isinstance(meta, dict):
        raise CodeObjectError(f"the AMDGPU metadata is a {type(meta).__name__}, expected a map")
    return meta


def _target_id(meta: dict[str, Any]) -> str:
    target = meta.get("amdhsa.target")
    prefix = "amdgcn-amd-amdhsa--"
    if not isinstance(target, str) or not target.startswith(prefix):
        raise CodeObjectError(f"metadata amdhsa.target should be '{prefix}<gfx...>', got {target!r}")
    return target[len(prefix) :]


def _metadata_kernels(meta: dict[str, Any]) -> list[dict[str, Any]]:
    kernels = meta.get("amdhsa.kernels")
    if not isinstance(kernels, list) or not all(isinstance(k, dict) for k in kernels):
        raise CodeObjectError(f"metadata amdhsa.kernels should be a list of maps, got {type(kernels).__name__}")
    return kernels


def _symbols(image: bytes, sections: tuple[_Section, ...]) -> dict[str, tuple[int, int, int]]:
    """name -> (value, size, type) of the defined symbols of .symtab, or of .dynsym where there is no .symtab."""
    tables = [s for s in sections if s.type == SHT_SYMTAB] or [s for s in sections if s.type == SHT_DYNSYM]
    out: dict[str, tuple[int, int, int]] = {}
    for table in tables:
        if table.link >= len(sections):
            raise CodeObjectError(f"symbol table {table.name} names string table {table.link}, which does not exist")
        strings = sections[table.link]
        for pos in range(table.offset, table.offset + table.size, table.entsize or 24):
            st_name, st_info, _, st_shndx, st_value, st_size = _unpack("<IBBHQQ", image, pos, "a symbol")
            if st_shndx == 0 or st_name == 0:
                continue  # undefined or unnamed
            out[_cstring(image, strings.offset + st_name, "a symbol name")] = (st_value, st_size, st_info & 0xF)
    return out


def _relocations(image: bytes, sections: tuple[_Section, ...]) -> tuple[tuple[int, int], ...]:
    out = []
    for s in sections:
        if s.type == SHT_REL:
            raise CodeObjectError(f"section {s.name} holds REL relocations; AMDGPU code objects use RELA only")
        if s.type != SHT_RELA:
            continue
        for pos in range(s.offset, s.offset + s.size, s.entsize or 24):
            r_offset, r_info, r_addend = _unpack("<QQq", image, pos, f"a relocation of {s.name}")
            kind, symbol = r_info & 0xFFFFFFFF, r_info >> 32
            if kind == R_AMDGPU_NONE:
                continue
            if kind != R_AMDGPU_RELATIVE64 or symbol != 0:
                raise CodeObjectError(
                    f"relocation type {kind} (symbol {symbol}) at 0x{r_offset:x} in {s.name}: only "
                    f"R_AMDGPU_RELATIVE64 ({R_AMDGPU_RELATIVE64}) is handled; link the code object without external "
                    "symbols"
                )
            out.append((r_offset, r_addend))
    return tuple(out)


def _read_vaddr(image: bytes, segments: tuple[Segment, ...], vaddr: int, size: int) -> bytes:
    for s in segments:
        if s.vaddr <= vaddr and vaddr + size <= s.vaddr + s.filesz:
            at = s.offset + vaddr - s.vaddr
            return image[at : at + size]
    raise CodeObjectError(f"{size} bytes at address 0x{vaddr:x} are not in the file part of any PT_LOAD segment")


def _field(entry: dict[str, Any], key: str, kernel: str) -> int:
    value = entry.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise CodeObjectError(f"kernel {kernel!r}: metadata {key} should be an integer, got {value!r}")
    return value


def _kernel(
    image: bytes, segments: tuple[Segment, ...], symbols: dict[str, tuple[int, int, int]], entry: dict[str, Any]
) -> KernelInfo:
    name = entry.get(".name")
    if not isinstance(name, str):
        raise CodeObjectError(f"a kernel's metadata has no .name: {sorted(entry)}")
    symbol = entry.get(".symbol", f"{name}.kd")
    if symbol not in symbols:
        raise CodeObjectError(f"kernel {name!r}: its descriptor symbol {symbol!r} is not in the symbol table")
    kd_vaddr, _, _ = symbols[symbol]
    raw = _read_vaddr(image, segments, kd_vaddr, KERNEL_DESCRIPTOR_SIZE)
    kd = KernelDescriptor.decode(raw)
    args = []
    for i, a in enumerate(entry.get(".args", [])):
        if not isinstance(a, dict):
            raise CodeObjectError(f"kernel {name!r}: argument {i} of the metadata is not a map")
        offset, size = _field(a, ".offset", name), _field(a, ".size", name)
        kind = a.get(".value_kind")
        if not isinstance(kind, str):
            raise CodeObjectError(f"kernel {name!r}: argument {i} has no .value_kind")
        args.append(KernelArg(offset, size, kind, str(a.get(".name", "")), str(a.get(".address_space", ""))))
    info = KernelInfo(
        name=name,
        descriptor_vaddr=kd_vaddr,
        kernarg_size=_field(entry, ".kernarg_segment_size", name),
        kernarg_align=_field(entry, ".kernarg_segment_align", name),
        args=tuple(args),
        group_segment_size=_field(entry, ".group_segment_fixed_size", name),
        private_segment_size=_field(entry, ".private_segment_fixed_size", name),
        wavefront_size=_field(entry, ".wavefront_size", name),
        descriptor=raw,
        sgpr_count=int(entry.get(".sgpr_count", 0)),
        vgpr_count=int(entry.get(".vgpr_count", 0)),
        max_flat_workgroup_size=int(entry.get(".max_flat_workgroup_size", 0)),
        uses_dynamic_stack=bool(entry.get(".uses_dynamic_stack", False)),
        code_vaddr=kd_vaddr + kd.kernel_code_entry_byte_offset,
    )
    _check_agrees(info, kd, segments, symbols)
    return info


def _check_agrees(
    info: KernelInfo, kd: KernelDescriptor, segments: tuple[Segment, ...], symbols: dict[str, tuple[int, int, int]]
) -> None:
    """The descriptor says what the metadata says, and its code entry is the kernel's function, executable."""
    pairs = [
        ("group segment size", kd.group_segment_fixed_size, info.group_segment_size),
        ("private segment size", kd.private_segment_fixed_size, info.private_segment_size),
        ("kernarg size", kd.kernarg_size, info.kernarg_size),
        ("wavefront size", kd.wavefront_size, info.wavefront_size),
        ("dynamic stack", kd.uses_dynamic_stack, info.uses_dynamic_stack),
    ]
    for what, in_kd, in_meta in pairs:
        if in_kd != in_meta:
            raise CodeObjectError(f"kernel {info.name!r}: the descriptor's {what} is {in_kd}, the metadata's {in_meta}")
    if info.kernarg_align <= 0 or info.kernarg_align & (info.kernarg_align - 1):
        raise CodeObjectError(f"kernel {info.name!r}: kernarg alignment {info.kernarg_align} is not a power of 2")
    for a in info.args:
        if a.offset < 0 or a.offset + a.size > info.kernarg_size:
            raise CodeObjectError(
                f"kernel {info.name!r}: argument {a.name or a.kind} at {a.offset} (+{a.size}) lies outside the "
                f"{info.kernarg_size}-byte kernarg segment"
            )
    if not any(s.flags & PF_X and s.vaddr <= info.code_vaddr < s.vaddr + s.memsz for s in segments):
        raise CodeObjectError(
            f"kernel {info.name!r}: its code entry 0x{info.code_vaddr:x} is not in an executable segment"
        )
    if info.name in symbols and symbols[info.name][0] != info.code_vaddr:
        raise CodeObjectError(
            f"kernel {info.name!r}: the descriptor's code entry 0x{info.code_vaddr:x} is not the function's address "
            f"0x{symbols[info.name][0]:x}"
        )
