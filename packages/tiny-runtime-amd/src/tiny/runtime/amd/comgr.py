"""COMGR, ROCm's code object manager (libamd_comgr), as the other way from LLVM IR to a code object: where it is
installed it compiles with the LLVM inside it, no clang or ld.lld needed. It is used only where the library loads
and knows the target (tiny.runtime.amd.compiler.amdgpu_compiler prefers the system's clang and ld.lld).

Through ctypes: the IR goes in as a BC data object (COMGR parses text IR there too), CODEGEN_BC_TO_RELOCATABLE makes
an object and LINK_RELOCATABLE_TO_EXECUTABLE the code object, which is read back with tiny.runtime.amd.elf. COMGR's
log of each action becomes the CompileError's message when one fails.

COMGR runs in a child process (`python -m tiny.runtime.amd.comgr`), never in tiny's: it carries its own copy of
parts of LLVM, which abort the process when another LLVM user is loaded beside it (PoCL for the CL device: "Option
'limited-coverage-experimental' registered more than once"). One child answers what COMGR is and knows (once per
process), one child per compile.
"""

from __future__ import annotations

import ctypes
import json
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

from tiny.ir.device import CompileError, Compiler, DeviceUnavailable
from tiny.runtime.amd.elf import CodeObjectError, read_code_object

LIBRARIES = ("libamd_comgr.so.3", "libamd_comgr.so.2", "libamd_comgr.so")

# amd_comgr.h
STATUS_SUCCESS = 0
DATA_KIND_LOG, DATA_KIND_BC, DATA_KIND_RELOCATABLE, DATA_KIND_EXECUTABLE = 5, 6, 7, 8
ACTION_CODEGEN_BC_TO_RELOCATABLE, ACTION_LINK_RELOCATABLE_TO_EXECUTABLE = 6, 9
OPT_LEVEL = b"-O3"

_handle = ctypes.c_uint64  # every COMGR object is a struct of one uint64, passed by value
_size = ctypes.c_size_t
_SIGNATURES: dict[str, list[Any]] = {
    "amd_comgr_get_version": [ctypes.POINTER(_size), ctypes.POINTER(_size)],
    "amd_comgr_status_string": [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)],
    "amd_comgr_get_isa_count": [ctypes.POINTER(_size)],
    "amd_comgr_get_isa_name": [_size, ctypes.POINTER(ctypes.c_char_p)],
    "amd_comgr_create_data": [ctypes.c_int, ctypes.POINTER(_handle)],
    "amd_comgr_release_data": [_handle],
    "amd_comgr_set_data": [_handle, _size, ctypes.c_char_p],
    "amd_comgr_set_data_name": [_handle, ctypes.c_char_p],
    "amd_comgr_get_data": [_handle, ctypes.POINTER(_size), ctypes.c_char_p],
    "amd_comgr_create_data_set": [ctypes.POINTER(_handle)],
    "amd_comgr_destroy_data_set": [_handle],
    "amd_comgr_data_set_add": [_handle, _handle],
    "amd_comgr_action_data_count": [_handle, ctypes.c_int, ctypes.POINTER(_size)],
    "amd_comgr_action_data_get_data": [_handle, ctypes.c_int, _size, ctypes.POINTER(_handle)],
    "amd_comgr_create_action_info": [ctypes.POINTER(_handle)],
    "amd_comgr_destroy_action_info": [_handle],
    "amd_comgr_action_info_set_isa_name": [_handle, ctypes.c_char_p],
    "amd_comgr_action_info_set_option_list": [_handle, ctypes.POINTER(ctypes.c_char_p), _size],
    "amd_comgr_action_info_set_logging": [_handle, ctypes.c_bool],
    "amd_comgr_do_action": [ctypes.c_int, _handle, _handle, _handle],
}


class Comgr:
    """libamd_comgr with its functions typed, its version and the targets it knows."""

    def __init__(self, lib: ctypes.CDLL, path: str) -> None:
        self.lib, self.path = lib, path
        for fn, argtypes in _SIGNATURES.items():
            f = getattr(lib, fn)
            f.restype, f.argtypes = ctypes.c_int, argtypes
        major, minor = _size(), _size()
        lib.amd_comgr_get_version(ctypes.byref(major), ctypes.byref(minor))
        self.version = f"{major.value}.{minor.value}"
        count = _size()
        self("amd_comgr_get_isa_count", ctypes.byref(count))
        names = []
        for i in range(count.value):
            name = ctypes.c_char_p()
            self("amd_comgr_get_isa_name", i, ctypes.byref(name))
            names.append((name.value or b"").decode().rpartition("--")[2])
        self.processors = frozenset(n.split(":")[0] for n in names)

    def __call__(self, fn: str, *args: Any) -> None:
        status = getattr(self.lib, fn)(*args)
        if status != STATUS_SUCCESS:
            text = ctypes.c_char_p()
            self.lib.amd_comgr_status_string(status, ctypes.byref(text))
            raise RuntimeError(f"{fn} failed: {(text.value or b'?').decode()} ({status})")

    def knows(self, target: str) -> bool:
        return target.split(":")[0] in self.processors

    def data(self, data: int) -> bytes:
        size = _size()
        self("amd_comgr_get_data", _handle(data), ctypes.byref(size), None)
        out = ctypes.create_string_buffer(size.value)
        self("amd_comgr_get_data", _handle(data), ctypes.byref(size), out)
        return out.raw[: size.value]

    def outputs(self, data_set: _handle, kind: int) -> list[bytes]:
        count = _size()
        self("amd_comgr_action_data_count", data_set, kind, ctypes.byref(count))
        out = []
        for i in range(count.value):
            item = _handle()
            self("amd_comgr_action_data_get_data", data_set, kind, i, ctypes.byref(item))
            try:
                out.append(self.data(item.value))
            finally:
                self.lib.amd_comgr_release_data(item)
        return out


def load_comgr(names: tuple[str, ...] = LIBRARIES) -> Comgr:
    """COMGR; DeviceUnavailable where none of `names` loads."""
    errors = []
    for name in names:
        try:
            return Comgr(ctypes.CDLL(name), name)
        except OSError as e:
            errors.append(str(e))
    raise DeviceUnavailable(
        f"no COMGR: none of {', '.join(names)} loads ({errors[-1]}); Debian: apt install libamd-comgr2"
    )


@dataclass(frozen=True)
class ComgrInfo:
    """What the COMGR installed here is: its library, version and the gfx targets it knows."""

    path: str
    version: str
    processors: frozenset[str]

    def knows(self, target: str) -> bool:
        return target.split(":")[0] in self.processors


def _child(args: list[str], stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", __name__, *args], input=stdin, capture_output=True, timeout=600)


@cache
def find_comgr() -> ComgrInfo | None:
    """COMGR as a child process finds it; None where it does not load (or the child fails)."""
    r = _child(["info"])
    if r.returncode != 0:
        return None
    info = json.loads(r.stdout)
    return ComgrInfo(info["path"], info["version"], frozenset(info["processors"]))


class COMGRCompiler(Compiler):
    """LLVM IR -> code object with COMGR (codegen, then link) in a child process, for a target COMGR knows."""

    def __init__(self, target: str = "gfx1100", comgr: ComgrInfo | None = None) -> None:
        found = comgr or find_comgr()
        if found is None:
            raise DeviceUnavailable("no COMGR (libamd_comgr) is installed, or it does not load")
        if not found.knows(target):
            known = " ".join(sorted(p for p in found.processors if p.startswith(("gfx9", "gfx1"))))
            raise DeviceUnavailable(f"COMGR {found.version} ({found.path}) does not know {target}; it knows {known}")
        self.comgr, self.target = found, target
        super().__init__(cachekey=f"amd:comgr:{target}:{found.path}:{found.version}")

    def compile(self, src: str) -> bytes:
        r = _child(["compile", self.target], src.encode())
        if r.returncode == 1:  # COMGR refused: the child says why
            raise CompileError(r.stderr.decode(errors="replace").strip())
        if r.returncode != 0:
            why = r.stderr.decode(errors="replace").strip()[-2000:]
            raise CompileError(
                f"COMGR's process failed ({r.returncode}) for {self.target}:\n{why}\n--- source ---\n{src}"
            )
        binary = r.stdout
        try:
            read_code_object(binary, expect_target=self.target)
        except CodeObjectError as e:
            what = f"COMGR's code object for {self.target} is not loadable: {e}"
            raise CompileError(f"{what}\n--- source ---\n{src}") from e
        return binary


def compile_in_process(comgr: Comgr, target: str, src: str) -> bytes:
    """What the child does: codegen and link with the loaded COMGR; CompileError with COMGR's log where it fails."""
    c = comgr
    made: list[tuple[str, _handle]] = []  # what to release, in reverse order

    def new(kind: str) -> _handle:
        h = _handle()
        c({"set": "amd_comgr_create_data_set", "info": "amd_comgr_create_action_info"}[kind], ctypes.byref(h))
        made.append((kind, h))
        return h

    def action(kind: int, info: _handle, inputs: _handle, outputs: _handle, what: str) -> None:
        if c.lib.amd_comgr_do_action(kind, info, inputs, outputs) != STATUS_SUCCESS:
            log = "\n".join(b.decode(errors="replace") for b in c.outputs(outputs, DATA_KIND_LOG)).strip()
            raise CompileError(f"COMGR {what} failed for {target}:\n{log}\n--- source ---\n{src}")

    try:
        data = _handle()
        c("amd_comgr_create_data", DATA_KIND_BC, ctypes.byref(data))
        made.append(("data", data))
        raw = src.encode()
        c("amd_comgr_set_data", data, len(raw), raw)
        c("amd_comgr_set_data_name", data, b"kernel.ll")
        source, objects, executable, info = new("set"), new("set"), new("set"), new("info")
        c("amd_comgr_data_set_add", source, data)
        c("amd_comgr_action_info_set_isa_name", info, f"amdgcn-amd-amdhsa--{target}".encode())
        c("amd_comgr_action_info_set_logging", info, True)
        c("amd_comgr_action_info_set_option_list", info, (ctypes.c_char_p * 1)(OPT_LEVEL), 1)
        action(ACTION_CODEGEN_BC_TO_RELOCATABLE, info, source, objects, "codegen")
        c("amd_comgr_action_info_set_option_list", info, (ctypes.c_char_p * 1)(), 0)
        action(ACTION_LINK_RELOCATABLE_TO_EXECUTABLE, info, objects, executable, "link")
        (binary,) = c.outputs(executable, DATA_KIND_EXECUTABLE)
        return binary
    finally:
        for kind, h in reversed(made):
            fn = {"data": "release_data", "set": "destroy_data_set", "info": "destroy_action_info"}[kind]
            getattr(c.lib, f"amd_comgr_{fn}")(h)


def _main(argv: list[str]) -> int:
    """The child: `info` prints COMGR's path, version and targets as JSON; `compile <target>` reads LLVM IR on stdin
    and writes the code object to stdout (exit 1 and the reason on stderr where COMGR refuses it)."""
    try:
        comgr = load_comgr()
    except DeviceUnavailable as e:
        print(e, file=sys.stderr)
        return 2
    if argv == ["info"]:
        print(json.dumps({"path": comgr.path, "version": comgr.version, "processors": sorted(comgr.processors)}))
        return 0
    if len(argv) == 2 and argv[0] == "compile":
        try:
            binary = compile_in_process(comgr, argv[1], sys.stdin.read())
        except CompileError as e:
            print(e, file=sys.stderr)
            return 1
        sys.stdout.buffer.write(binary)
        return 0
    print(f"usage: python -m {__name__} info | compile <gfx target>  (got {argv})", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
