"""A MessagePack decoder, as much of the format as AMDGPU code-object metadata uses and the rest of it checked.

The metadata note of a code object (NT_AMDGPU_METADATA) is one MessagePack map. `unpack` turns bytes into Python
values: nil -> None, booleans, integers, floats, str -> str, bin -> bytes, arrays -> lists, maps -> dicts. An
extension type, a truncated value or bytes left over are refused with a MsgpackError that says where.
"""

from __future__ import annotations

import struct
from typing import Any


class MsgpackError(ValueError):
    """Bytes that are not one well-formed MessagePack value."""


def unpack(data: bytes) -> Any:
    """The one MessagePack value that `data` holds."""
    reader = _Reader(bytes(data))
    value = reader.value(0)
    if reader.pos != len(reader.data):
        raise MsgpackError(f"{len(reader.data) - reader.pos} bytes after the MessagePack value (at byte {reader.pos})")
    return value


_MAX_DEPTH = 64  # metadata nests a few levels; a deeper value is damage, not data

# formats whose payload is a fixed-size number: first byte -> struct format
_NUMBERS = {
    0xCA: ">f",
    0xCB: ">d",
    0xCC: ">B",
    0xCD: ">H",
    0xCE: ">I",
    0xCF: ">Q",
    0xD0: ">b",
    0xD1: ">h",
    0xD2: ">i",
    0xD3: ">q",
}
# formats with a length before their payload: first byte -> (kind, struct format of the length)
_SIZED = {
    0xC4: ("bin", ">B"),
    0xC5: ("bin", ">H"),
    0xC6: ("bin", ">I"),
    0xD9: ("str", ">B"),
    0xDA: ("str", ">H"),
    0xDB: ("str", ">I"),
    0xDC: ("array", ">H"),
    0xDD: ("array", ">I"),
    0xDE: ("map", ">H"),
    0xDF: ("map", ">I"),
}


class _Reader:
    def __init__(self, data: bytes) -> None:
        self.data, self.pos = data, 0

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise MsgpackError(f"MessagePack cut short: {n} bytes needed at byte {self.pos} of {len(self.data)}")
        out = self.data[self.pos : self.pos + n]
        self.pos += n
        return out

    def number(self, fmt: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt)))[0]

    def value(self, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise MsgpackError(f"MessagePack nests deeper than {_MAX_DEPTH} levels (at byte {self.pos})")
        at = self.pos
        b = self.take(1)[0]
        if b <= 0x7F:  # positive fixint
            return b
        if b >= 0xE0:  # negative fixint
            return b - 0x100
        if 0x80 <= b <= 0x8F:
            return self.items("map", b & 0x0F, depth)
        if 0x90 <= b <= 0x9F:
            return self.items("array", b & 0x0F, depth)
        if 0xA0 <= b <= 0xBF:
            return self.string(b & 0x1F, at)
        if b == 0xC0:
            return None
        if b in (0xC2, 0xC3):
            return b == 0xC3
        if b in _NUMBERS:
            return self.number(_NUMBERS[b])
        if b in _SIZED:
            kind, fmt = _SIZED[b]
            n = self.number(fmt)
            if kind == "bin":
                return self.take(n)
            if kind == "str":
                return self.string(n, at)
            return self.items(kind, n, depth)
        if b == 0xC1:
            raise MsgpackError(f"byte 0xc1 at {at} is never used by MessagePack")
        raise MsgpackError(f"MessagePack extension type (0x{b:02x}) at byte {at}: not used by code-object metadata")

    def string(self, n: int, at: int) -> str:
        raw = self.take(n)
        try:
            return raw.decode()
        except UnicodeDecodeError as e:
            raise MsgpackError(f"MessagePack string at byte {at} is not UTF-8: {e}") from None

    def items(self, kind: str, n: int, depth: int) -> list[Any] | dict[Any, Any]:
        if kind == "array":
            return [self.value(depth + 1) for _ in range(n)]
        out: dict[Any, Any] = {}
        for _ in range(n):
            at = self.pos
            key = self.value(depth + 1)
            if isinstance(key, (list, dict)):
                raise MsgpackError(f"MessagePack map key at byte {at} is a {type(key).__name__}: not hashable")
            out[key] = self.value(depth + 1)
        return out
