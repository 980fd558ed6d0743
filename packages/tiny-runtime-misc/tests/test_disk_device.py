"""The DISK device: a file mapped into memory, its buffers byte ranges of the file."""

from __future__ import annotations

import os

import pytest

from tiny.ir.device import Buffer, Device, DeviceUnavailable, available
from tiny.ir.dtypes import dtypes


@pytest.fixture
def blob(tmp_path):
    path = tmp_path / "blob.bin"
    path.write_bytes(bytes(range(64)))
    return path


def test_names_are_one_device_per_file(blob):
    name = Device.canonicalize(f"disk:{blob}")
    assert name == f"DISK:{blob}"
    assert Device.canonicalize(f"DISK:{os.path.relpath(blob)}") == name  # relative paths become absolute
    assert Device[name] is Device[f"disk:{blob}"]
    assert type(Device[name]).computes is False


def test_plain_disk_names_no_file():
    with pytest.raises(DeviceUnavailable, match="one device per file"):
        Device["DISK"]
    status = {s.name: s for s in available()}["DISK"]
    assert status.ok and "DISK:/path/to/file" in status.reason


def test_buffers_read_the_file_and_views_share_it(blob):
    name = f"DISK:{blob}"
    whole = Buffer(name, 64, dtypes.uint8)
    assert whole.as_bytes() == bytes(range(64))
    view = whole.view(4, dtypes.int32, 16)  # bytes 16..31 as four little-endian int32
    assert view.base is whole and view.offset == 16
    assert view.as_bytes() == bytes(range(16, 32))
    inner = view.view(2, dtypes.uint8, 3)  # a view of a view is a view of the base
    assert inner.base is whole and inner.offset == 19 and inner.as_bytes() == bytes([19, 20])
    with pytest.raises(ValueError, match="does not fit"):
        whole.view(8, dtypes.float64, 8)


def test_views_see_the_file_without_reading_it_first(blob):
    view = Buffer(f"DISK:{blob}", 64, dtypes.uint8).view(4, dtypes.uint8, 60)
    with open(blob, "r+b") as f:  # the mapping is the file: a write through the file shows in the view
        view.ensure_allocated()
        f.seek(60)
        f.write(b"\xff\xfe\xfd\xfc")
    assert view.as_bytes() == b"\xff\xfe\xfd\xfc"


def test_copy_to_a_compute_device_is_one_read_of_the_file(blob, monkeypatch):
    """A copy into host-visible memory reads the file with its descriptor, straight into that memory: the mapping's
    pages are not touched (touched, they stayed resident in this process beside the copy, until exit)."""
    from tiny.runtime.disk import DiskAllocator

    def untouched(*_):
        raise AssertionError("the copy read the file's mapping")

    monkeypatch.setattr(DiskAllocator, "as_memoryview", untouched)
    src = Buffer(f"DISK:{blob}", 64, dtypes.uint8).view(8, dtypes.float32, 32)
    out = Buffer("PYTHON", 8, dtypes.float32)
    out.copy_from(src)
    assert out.as_bytes() == bytes(range(32, 64))


def test_a_write_through_the_mapping_is_what_a_read_finds(tmp_path):
    name = f"DISK:{tmp_path / 'new.bin'}"
    disk = Buffer(name, 16, dtypes.uint8)
    disk.copyin(memoryview(bytes(range(100, 116))))
    out = Buffer("PYTHON", 8, dtypes.uint8)
    out.copy_from(disk.view(8, dtypes.uint8, 4))
    assert out.as_bytes() == bytes(range(104, 112))


def test_writing_grows_a_new_file(tmp_path):
    path = tmp_path / "sub.bin"
    buf = Buffer(f"DISK:{path}", 3, dtypes.float32)
    buf.copyin(memoryview(bytes(range(12))))
    assert path.read_bytes() == bytes(range(12))
    back = Buffer("PYTHON", 3, dtypes.float32)
    back.copy_from(buf)
    assert back.as_bytes() == bytes(range(12))


def test_read_only_files_read_and_refuse_writes(blob, monkeypatch):
    real_open = os.open

    def no_write(path, flags, *args):
        if flags & os.O_RDWR:
            raise PermissionError(13, "Permission denied")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", no_write)
    buf = Buffer(f"DISK:{blob}", 64, dtypes.uint8)  # a device of its own: the name differs from other tests'
    assert buf.as_bytes()[:4] == bytes(range(4))
    with pytest.raises(PermissionError, match="read-only"):
        buf.copyin(memoryview(bytes(64)))
    with pytest.raises(ValueError, match="read-only"):
        Buffer(f"DISK:{blob}", 65, dtypes.uint8).ensure_allocated()


def test_a_missing_directory_is_reported(tmp_path):
    with pytest.raises(DeviceUnavailable, match="cannot open"):
        Buffer(f"DISK:{tmp_path}/no/such/dir/f.bin", 4, dtypes.uint8).ensure_allocated()


def test_an_empty_file_maps(tmp_path):
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    buf = Buffer(f"DISK:{path}", 0, dtypes.uint8)
    assert buf.as_bytes() == b""


def test_no_kernels_run_on_disk(blob):
    with pytest.raises(RuntimeError, match="no kernels run on DISK"):
        Device[f"DISK:{blob}"].compile("")
