"""Mesa's NIR builder through the tinymesa wheel (`pip install 'tiny-tensor[mesa]'`), with ctypes.

tinymesa ships Mesa's compilers as two libraries: `libtinymesa.so` (the NIR builder, NAK for NVIDIA, ir3 for Adreno;
it needs nothing but libc, zlib and zstd) and `libtinymesa_cpu.so` (the same with llvmpipe's NIR-to-LLVM back end,
gallivm, linked against the system's LLVM 20 as `libLLVM.so.20.1`). The structures below are written from Mesa
25.2's headers (nir.h, nir_builder.h, shader_info.h, util/blob.h): a wheel of another Mesa version is refused when it
is loaded, naming both versions, since a field that moved would be read from the wrong place. What the library can
tell about itself is read from it: the numbers of the ALU ops, of the intrinsics and of their indices come from its
own tables (`nir_op_infos`, `nir_intrinsic_infos`, `nir_intrinsic_index_names`), by name.

Only functions the library exports are called: many of nir_builder.h's helpers are `static inline` and so are not
in it, and are written again here from what they do (an intrinsic is created, its indices and sources set, its
def initialized and the instruction inserted).
"""

from __future__ import annotations

import ctypes
import importlib.metadata
import os
import tempfile
import threading
from dataclasses import dataclass
from functools import cache
from typing import Any

from tiny.ir.device import DeviceUnavailable

try:
    import tinymesa
except ImportError:  # the NIR renderers say so when they are chosen
    tinymesa = None

MESA_VERSION = "25.2.7"  # the Mesa these bindings are written for
WHEEL = "tinymesa==25.2.7.2"
INSTALL_HINT = f"pip install 'tiny-tensor[mesa]' (or pip install {WHEEL})"
LLVM_SONAME = "libLLVM.so.20.1"  # what libtinymesa_cpu.so is linked against

MESA_SHADER_COMPUTE = 5  # gl_shader_stage
NIR_INTRINSIC_MAX_CONST_INDEX = 8
NIR_INTRINSIC_MAX_INPUTS = 11
NIR_JUMP_BREAK = 2  # nir_jump_type: return, halt, break, continue, goto, goto_if

# mesa_scope and nir_memory_semantics / nir_variable_mode values a barrier takes
SCOPE_WORKGROUP = 4
NIR_MEMORY_ACQ_REL = 3
NIR_VAR_MEM_SHARED = 1 << 19
ACCESS_CAN_REORDER = 1 << 6  # gl_access_qualifier: a load that may move (nothing writes what it reads)

# shader_info inside nir_shader: gctx (8) + the variables' exec_list (32) + options (8), then shader_info
SHADER_INFO = 48
INFO_NUM_UBOS = 54  # uint8_t num_ubos
INFO_SHARED_SIZE = 268  # unsigned shared_size
INFO_WORKGROUP_SIZE = 280  # uint16_t workgroup_size[3]


class ExecNode(ctypes.Structure):
    _fields_ = [("next", ctypes.c_void_p), ("prev", ctypes.c_void_p)]


class Instr(ctypes.Structure):
    """nir_instr: the header every instruction starts with."""

    _fields_ = [
        ("node", ExecNode),
        ("block", ctypes.c_void_p),
        ("type", ctypes.c_uint8),
        ("pass_flags", ctypes.c_uint8),
        ("has_debug_info", ctypes.c_bool),
        ("index", ctypes.c_uint32),
    ]


class Def(ctypes.Structure):
    """nir_def: an SSA value."""

    _fields_ = [
        ("parent_instr", ctypes.c_void_p),
        ("uses", ExecNode),  # (struct list_head: two pointers, as exec_node)
        ("index", ctypes.c_uint),
        ("num_components", ctypes.c_uint8),
        ("bit_size", ctypes.c_uint8),
        ("divergent", ctypes.c_bool),
        ("loop_invariant", ctypes.c_bool),
    ]


class Src(ctypes.Structure):
    """nir_src: a use of an SSA value (its parent and use link are set when the instruction is inserted)."""

    _fields_ = [("parent", ctypes.c_size_t), ("use_link", ExecNode), ("ssa", ctypes.POINTER(Def))]


class IntrinsicInstr(ctypes.Structure):
    """nir_intrinsic_instr, without its sources (a flexible array that starts at sizeof(IntrinsicInstr))."""

    _fields_ = [
        ("instr", Instr),
        ("intrinsic", ctypes.c_int),
        ("def_", Def),
        ("num_components", ctypes.c_uint8),
        ("const_index", ctypes.c_int * NIR_INTRINSIC_MAX_CONST_INDEX),
        ("name", ctypes.c_char_p),
    ]

    def sources(self, n: int) -> Any:
        return (Src * n).from_address(ctypes.addressof(self) + ctypes.sizeof(IntrinsicInstr))


class LoadConstInstr(ctypes.Structure):
    """nir_load_const_instr, without its values (nir_const_value, 8 bytes each, from sizeof(LoadConstInstr))."""

    _fields_ = [("instr", Instr), ("def_", Def)]

    def values(self, n: int) -> Any:
        return (ctypes.c_uint64 * n).from_address(ctypes.addressof(self) + ctypes.sizeof(LoadConstInstr))


class UndefInstr(ctypes.Structure):
    _fields_ = [("instr", Instr), ("def_", Def)]


class Builder(ctypes.Structure):
    """nir_builder: where the next instruction goes (a cursor), the shader and its entry point's implementation."""

    _fields_ = [
        ("cursor_option", ctypes.c_int),
        ("cursor_at", ctypes.c_void_p),
        ("exact", ctypes.c_bool),
        ("fp_fast_math", ctypes.c_uint32),
        ("shader", ctypes.c_void_p),
        ("impl", ctypes.c_void_p),
    ]


class Scalar(ctypes.Structure):
    """nir_scalar: one component of an SSA value."""

    _fields_ = [("def_", ctypes.POINTER(Def)), ("comp", ctypes.c_uint)]


class Blob(ctypes.Structure):
    """util/blob.h's growing buffer (what nir_serialize writes into)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("allocated", ctypes.c_size_t),
        ("size", ctypes.c_size_t),
        ("fixed_allocation", ctypes.c_bool),
        ("out_of_memory", ctypes.c_bool),
    ]


class BlobReader(ctypes.Structure):
    """util/blob.h's reader (what nir_deserialize reads from)."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("end", ctypes.c_void_p),
        ("current", ctypes.c_void_p),
        ("overrun", ctypes.c_bool),
    ]


class _OpInfo(ctypes.Structure):
    """nir_op_info's first field, and its size (the rest is not read)."""

    _fields_ = [("name", ctypes.c_char_p), ("_rest", ctypes.c_uint8 * 48)]


class _IntrinsicInfo(ctypes.Structure):
    """nir_intrinsic_info: what an intrinsic takes and which const_index slot holds each of its indices."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("num_srcs", ctypes.c_uint8),
        ("src_components", ctypes.c_int8 * NIR_INTRINSIC_MAX_INPUTS),
        ("has_dest", ctypes.c_bool),
        ("dest_components", ctypes.c_uint8),
        ("dest_bit_sizes", ctypes.c_uint8),
        ("bit_size_src", ctypes.c_int8),
        ("num_indices", ctypes.c_uint8),
        ("indices", ctypes.c_uint8 * NIR_INTRINSIC_MAX_CONST_INDEX),
        ("index_map", ctypes.c_uint8 * 75),  # NIR_INTRINSIC_NUM_INDEX_FLAGS in 25.2
        ("flags", ctypes.c_int),
    ]


_P = ctypes.c_void_p
_DEF = ctypes.POINTER(Def)
_FUNCTIONS: dict[str, tuple[Any, list[Any]]] = {
    "glsl_type_singleton_init_or_ref": (None, []),
    "nir_builder_init_simple_shader": (Builder, [ctypes.c_int, _P, ctypes.c_char_p]),
    "nir_build_alu1": (_DEF, [ctypes.POINTER(Builder), ctypes.c_int, _DEF]),
    "nir_build_alu2": (_DEF, [ctypes.POINTER(Builder), ctypes.c_int, _DEF, _DEF]),
    "nir_build_alu3": (_DEF, [ctypes.POINTER(Builder), ctypes.c_int, _DEF, _DEF, _DEF]),
    "nir_vec_scalars": (_DEF, [ctypes.POINTER(Builder), ctypes.POINTER(Scalar), ctypes.c_uint]),
    "nir_intrinsic_instr_create": (ctypes.POINTER(IntrinsicInstr), [_P, ctypes.c_int]),
    "nir_load_const_instr_create": (ctypes.POINTER(LoadConstInstr), [_P, ctypes.c_uint, ctypes.c_uint]),
    "nir_undef_instr_create": (ctypes.POINTER(UndefInstr), [_P, ctypes.c_uint, ctypes.c_uint]),
    "nir_jump_instr_create": (_P, [_P, ctypes.c_int]),
    "nir_def_init": (None, [_P, _DEF, ctypes.c_uint, ctypes.c_uint]),
    "nir_builder_instr_insert": (None, [ctypes.POINTER(Builder), _P]),
    "nir_push_loop": (_P, [ctypes.POINTER(Builder)]),
    "nir_pop_loop": (None, [ctypes.POINTER(Builder), _P]),
    "nir_push_if": (_P, [ctypes.POINTER(Builder), _DEF]),
    "nir_push_else": (_P, [ctypes.POINTER(Builder), _P]),
    "nir_pop_if": (None, [ctypes.POINTER(Builder), _P]),
    "nir_lower_reg_intrinsics_to_ssa": (ctypes.c_bool, [_P]),
    "nir_validate_shader": (None, [_P, ctypes.c_char_p]),
    "nir_print_shader": (None, [_P, _P]),
    "blob_init": (None, [ctypes.POINTER(Blob)]),
    "nir_serialize": (None, [ctypes.POINTER(Blob), _P, ctypes.c_bool]),
    "blob_reader_init": (None, [ctypes.POINTER(BlobReader), _P, ctypes.c_size_t]),
    "nir_deserialize": (_P, [_P, _P, ctypes.POINTER(BlobReader)]),
    "ralloc_free": (None, [_P]),
}


@dataclass(frozen=True)
class Mesa:
    """libtinymesa.so loaded, its functions declared, and its tables of ALU ops and intrinsics read by name."""

    lib: Any
    ops: dict[str, int]  # nir_op_* by name ("fadd" -> its number)
    intrinsics: dict[str, int]  # nir_intrinsic_* by name
    index_kinds: dict[str, int]  # NIR_INTRINSIC_* index kinds by name ("align_mul" -> its number)
    intrinsic_infos: Any  # the nir_intrinsic_infos array

    def __getattr__(self, name: str) -> Any:
        return getattr(self.lib, name)

    def index_slot(self, intrinsic: int, kind: str) -> int:
        """The const_index slot that holds index `kind` of `intrinsic`."""
        slot = self.intrinsic_infos[intrinsic].index_map[self.index_kinds[kind]]
        if slot == 0:
            name = self.intrinsic_infos[intrinsic].name.decode()
            raise ValueError(f"the NIR intrinsic {name} has no index {kind!r}")
        return slot - 1


def wheel_version() -> str:
    """The tinymesa wheel's version; DeviceUnavailable, saying how to install it, where it is not installed."""
    try:
        return importlib.metadata.version("tinymesa")
    except importlib.metadata.PackageNotFoundError:
        raise DeviceUnavailable(
            f"Mesa's compilers come from the tinymesa wheel, which is not installed: {INSTALL_HINT}"
        ) from None


def check_version(version: str) -> None:
    """Refuse a tinymesa of another Mesa than the one the structures here are written for, naming both."""
    mesa = ".".join(version.split(".")[:3])
    if mesa != MESA_VERSION:
        raise DeviceUnavailable(
            f"tinymesa {version} carries Mesa {mesa}, but tiny's NIR bindings are written for Mesa {MESA_VERSION}'s "
            f"structure layouts: pip install {WHEEL}"
        )


def library_path(name: str) -> str:
    """The path of one of the wheel's libraries (`libtinymesa.so`, `libtinymesa_cpu.so`), its version checked."""
    check_version(wheel_version())
    if tinymesa is None:
        raise DeviceUnavailable(
            f"the tinymesa wheel's metadata is there but its module does not import: {INSTALL_HINT}"
        )
    path = str(getattr(tinymesa, name.removesuffix(".so")))
    if not os.path.exists(path):
        raise DeviceUnavailable(f"the tinymesa wheel has no {name} at {path}: reinstall it ({INSTALL_HINT})")
    return path


@cache
def mesa() -> Mesa:
    """libtinymesa.so, loaded once: the NIR builder, NAK and ir3 (no LLVM needed)."""
    lib = ctypes.CDLL(library_path("libtinymesa.so"))
    for fn, (restype, argtypes) in _FUNCTIONS.items():
        getattr(lib, fn).restype, getattr(lib, fn).argtypes = restype, argtypes
    lib.glsl_type_singleton_init_or_ref()  # (the shader's printer and serializer look types up)
    n_ops = _symbol_size(lib, "nir_op_infos", _OpInfo)
    n_intrinsics = _symbol_size(lib, "nir_intrinsic_infos", _IntrinsicInfo)
    op_infos = (_OpInfo * n_ops).in_dll(lib, "nir_op_infos")
    intrinsic_infos = (_IntrinsicInfo * n_intrinsics).in_dll(lib, "nir_intrinsic_infos")
    index_names = (ctypes.c_char_p * len(_IntrinsicInfo().index_map)).in_dll(lib, "nir_intrinsic_index_names")
    return Mesa(
        lib,
        {o.name.decode(): i for i, o in enumerate(op_infos)},
        {x.name.decode(): i for i, x in enumerate(intrinsic_infos)},
        {n.decode(): i for i, n in enumerate(index_names)},
        intrinsic_infos,
    )


# the number of entries of Mesa 25.2.7's tables: where the library's own count differs, its structures do too
_TABLE_SIZES = {"nir_op_infos": 489, "nir_intrinsic_infos": 732}


def _symbol_size(lib: Any, name: str, entry: type) -> int:
    """Entries in the table `name`, checked against the last one's name being there and the next being past it."""
    n = _TABLE_SIZES[name]
    table = (entry * n).in_dll(lib, name)
    if not all(t.name for t in (table[0], table[n - 1])):
        raise DeviceUnavailable(f"libtinymesa.so's {name} is not laid out as Mesa {MESA_VERSION}'s: {INSTALL_HINT}")
    return n


def llvmpipe_problem() -> str | None:
    """Why libtinymesa_cpu.so (llvmpipe's back end) cannot be loaded here, or None where it can."""
    try:
        path = library_path("libtinymesa_cpu.so")
    except DeviceUnavailable as e:
        return str(e)
    try:
        ctypes.CDLL(path)
    except OSError as e:
        if LLVM_SONAME in str(e):
            return (
                f"tinymesa's llvmpipe (libtinymesa_cpu.so) is linked against LLVM 20's shared library, {LLVM_SONAME}, "
                "which the dynamic loader does not find: install LLVM 20 (Debian 13/Ubuntu 25.04: apt install "
                "libllvm20)"
            )
        return f"libtinymesa_cpu.so does not load: {e}"
    return None


_stderr_lock = threading.Lock()


def captured_stderr(fn: Any) -> tuple[Any, str]:
    """fn()'s result and what it wrote to the process's stderr (where Mesa's compilers say why they failed)."""
    with _stderr_lock, tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        f.seek(0)
        return result, f.read().decode(errors="replace")


def print_to_string(write: Any) -> str:
    """What write(stream) writes to a C stdio stream (an open_memstream), as text."""
    libc = ctypes.CDLL(None)
    libc.open_memstream.restype = ctypes.c_void_p
    libc.open_memstream.argtypes = [ctypes.POINTER(ctypes.c_char_p), ctypes.POINTER(ctypes.c_size_t)]
    libc.fclose.argtypes = [ctypes.c_void_p]
    libc.free.argtypes = [ctypes.c_void_p]
    buf, size = ctypes.c_char_p(), ctypes.c_size_t()
    stream = libc.open_memstream(ctypes.byref(buf), ctypes.byref(size))
    write(stream)
    libc.fclose(stream)
    text = ctypes.string_at(buf, size.value).decode(errors="replace")
    libc.free(ctypes.cast(buf, ctypes.c_void_p))
    return text


def print_shader(shader: int) -> str:
    """The shader as nir_print_shader writes it."""
    return print_to_string(lambda stream: mesa().nir_print_shader(shader, stream))


def serialize(shader: int) -> bytes:
    """The shader as nir_serialize writes it (what nir_deserialize reads back), debug names kept."""
    blob = Blob()
    mesa().blob_init(ctypes.byref(blob))
    mesa().nir_serialize(ctypes.byref(blob), shader, False)
    if blob.out_of_memory:
        raise MemoryError("nir_serialize ran out of memory")
    data = ctypes.string_at(blob.data, blob.size)
    libc = ctypes.CDLL(None)
    libc.free.argtypes = [ctypes.c_void_p]
    libc.free(blob.data)
    return data


def deserialize(blob: bytes, options: int | None) -> int:
    """A shader from what nir_serialize wrote, with a back end's NIR options (a compiler's own): free it with
    ralloc_free."""
    reader = BlobReader()
    data = ctypes.create_string_buffer(blob, len(blob))
    mesa().blob_reader_init(ctypes.byref(reader), data, len(blob))
    shader = mesa().nir_deserialize(None, options, ctypes.byref(reader))
    if not shader or reader.overrun:
        raise ValueError(f"nir_deserialize could not read the {len(blob)}-byte shader")
    return shader
