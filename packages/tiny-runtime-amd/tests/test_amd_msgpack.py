"""The MessagePack decoder of code-object metadata: every format it reads, and what it refuses."""

import struct

import pytest

from tiny.runtime.amd.msgpack import MsgpackError, unpack


@pytest.mark.parametrize(
    "data, value",
    [
        (b"\x00", 0),
        (b"\x7f", 127),
        (b"\xff", -1),
        (b"\xe0", -32),
        (b"\xc0", None),
        (b"\xc2", False),
        (b"\xc3", True),
        (b"\xcc\xff", 255),
        (b"\xcd\x01\x00", 256),
        (b"\xce\x00\x01\x00\x00", 65536),
        (b"\xcf" + struct.pack(">Q", 2**64 - 1), 2**64 - 1),
        (b"\xd0\x80", -128),
        (b"\xd1\x80\x00", -32768),
        (b"\xd2\xff\xff\xff\xfe", -2),
        (b"\xd3" + struct.pack(">q", -(2**63)), -(2**63)),
        (b"\xca" + struct.pack(">f", 1.5), 1.5),
        (b"\xcb" + struct.pack(">d", -0.25), -0.25),
        (b"\xa3abc", "abc"),
        (b"\xd9\x05hello", "hello"),
        (b"\xda\x00\x02hi", "hi"),
        (b"\xdb\x00\x00\x00\x01z", "z"),
        (b"\xc4\x02\x01\x02", b"\x01\x02"),
        (b"\xc5\x00\x01\xff", b"\xff"),
        (b"\xc6\x00\x00\x00\x00", b""),
        (b"\x92\x01\xa1x", [1, "x"]),
        (b"\xdc\x00\x01\xc3", [True]),
        (b"\xdd\x00\x00\x00\x00", []),
        (b"\x82\xa1a\x01\xa1b\x91\x02", {"a": 1, "b": [2]}),
        (b"\xde\x00\x01\x01\x02", {1: 2}),
        (b"\xdf\x00\x00\x00\x01\xc0\xc0", {None: None}),
    ],
)
def test_formats(data: bytes, value: object) -> None:
    assert unpack(data) == value


def test_metadata_shaped_map() -> None:
    kernel = b"\x83\xa5.name\xa1k\xb5.kernarg_segment_size\x14\xa5.args\x91\x82\xa7.offset\x00\xa5.size\x08"
    data = b"\x82\xaeamdhsa.kernels\x91" + kernel + b"\xaeamdhsa.version\x92\x01\x02"
    meta = unpack(data)
    assert meta == {
        "amdhsa.kernels": [{".name": "k", ".kernarg_segment_size": 20, ".args": [{".offset": 0, ".size": 8}]}],
        "amdhsa.version": [1, 2],
    }


@pytest.mark.parametrize(
    "data, message",
    [
        (b"", "cut short"),
        (b"\xa5abc", "cut short"),
        (b"\x92\x01", "cut short"),
        (b"\xcd\x01", "cut short"),
        (b"\x01\x02", "1 bytes after"),
        (b"\xc1", "never used"),
        (b"\xd4\x01\x02", "extension type"),
        (b"\xc7\x01\x01\x00", "extension type"),
        (b"\xa2\xff\xfe", "not UTF-8"),
        (b"\x81\x90\x01", "not hashable"),
        (b"\x91" * 100 + b"\x00", "deeper than"),
    ],
)
def test_refuses_what_is_not_one_value(data: bytes, message: str) -> None:
    with pytest.raises(MsgpackError, match=message):
        unpack(data)
