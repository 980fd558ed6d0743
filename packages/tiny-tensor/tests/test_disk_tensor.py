"""Tensors on DISK: a file's bytes mapped lazily, viewed without kernels, copied once to a compute device;
safetensors loading through it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tiny.ir.device import Device, buffer_of
from tiny.nn.state import load_state_dict, safe_load, safe_save
from tiny.tensor import Tensor, dtypes
from tiny.tensor.realize import GlobalCounters


@pytest.fixture
def floats(tmp_path: Path) -> tuple[Path, np.ndarray]:
    arr = np.arange(24, dtype=np.float32) * 0.5
    path = tmp_path / "floats.bin"
    path.write_bytes(arr.tobytes())
    return path, arr


def _base(t: Tensor):
    node = t.uop
    while node.op.name != "BUFFER":
        node = node.src[0]
    return buffer_of(node)


def test_a_path_maps_the_file_as_bytes(floats) -> None:
    path, arr = floats
    t = Tensor(path)
    assert t.shape == (96,) and t.dtype == dtypes.uint8 and t.device == f"DISK:{path}"
    assert not _base(t).is_allocated  # nothing mapped or read yet
    np.testing.assert_array_equal(t.numpy(), np.frombuffer(arr.tobytes(), np.uint8))


def test_bitcast_to_another_size_and_views(floats) -> None:
    path, arr = floats
    f = Tensor(path).bitcast(dtypes.float32)
    assert f.shape == (24,) and f.dtype == dtypes.float32
    np.testing.assert_array_equal(f.numpy(), arr)
    np.testing.assert_array_equal(f.reshape(4, 6)[1:3].numpy(), arr.reshape(4, 6)[1:3])
    np.testing.assert_array_equal(Tensor(path, dtype="float32").numpy(), arr)
    halves = Tensor(path)[8:16].bitcast(dtypes.float16).bitcast(dtypes.int16)  # sizes change, then the same size
    np.testing.assert_array_equal(halves.numpy(), np.frombuffer(arr.tobytes()[8:16], np.int16))
    with pytest.raises(ValueError, match="whole number"):
        Tensor(path)[:6].bitcast(dtypes.float32)


def test_copy_to_a_device_is_one_copy_and_no_kernel(floats) -> None:
    path, arr = floats
    t = Tensor(path, dtype="float32").reshape(4, 6)[2:]
    GlobalCounters.reset()
    out = t.to("CPU").realize()
    assert (GlobalCounters.kernels, GlobalCounters.copies) == (0, 1)
    np.testing.assert_array_equal(out.numpy(), arr.reshape(4, 6)[2:])
    np.testing.assert_array_equal(Tensor(path, dtype="float32", device="PYTHON").numpy(), arr)


def test_computing_on_disk_is_refused_clearly(floats) -> None:
    path, _ = floats
    f = Tensor(path, dtype="float32")
    with pytest.raises(ValueError, match=r"only holds data.*\.to\(\)"):
        (f + 1).realize()
    with pytest.raises(ValueError, match="not one range"):
        f.reshape(4, 6)[:, ::2].to("CPU").realize()
    with pytest.raises(ValueError, match="not one range"):
        f.reshape(4, 6).permute(1, 0).numpy()
    with pytest.raises(FileNotFoundError, match="not a file"):
        Tensor(path.parent / "missing.bin")


def test_writing_to_a_file(tmp_path: Path) -> None:
    path = tmp_path / "out.bin"
    Tensor([1.5, -2.0, 3.25]).to(f"DISK:{path}").realize()
    assert np.frombuffer(path.read_bytes(), np.float32).tolist() == [1.5, -2.0, 3.25]
    assert Tensor(path, dtype="float32").tolist() == [1.5, -2.0, 3.25]


def test_safe_load_is_lazy_and_reads_each_tensor_once(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    w, b = np.arange(12, dtype=np.float32).reshape(3, 4), np.array([7, 8, 9], dtype=np.int64)
    safe_save({"w": Tensor(w), "b": Tensor(b)}, path)
    state = safe_load(path)
    view = _base(state["w"])
    assert view.base is not None and not view.base.is_allocated  # a view of the file, which is not even mapped yet
    # lazy: the file is read when the tensors are used, so a change to the file before that is seen
    raw = bytearray(path.read_bytes())
    at = raw.index(np.float32(5).tobytes())
    raw[at : at + 4] = np.float32(-5).tobytes()
    path.write_bytes(bytes(raw))
    GlobalCounters.reset()
    Tensor.realize(*state.values())
    assert (GlobalCounters.kernels, GlobalCounters.copies) == (0, 2)  # one copy per tensor, out of the mapping
    want = w.copy()
    want[1, 1] = -5
    np.testing.assert_array_equal(state["w"].numpy(), want)
    np.testing.assert_array_equal(state["b"].numpy(), b)


def test_safe_load_on_disk_and_into_a_model(tmp_path: Path) -> None:
    path = tmp_path / "m.safetensors"
    safe_save({"weight": Tensor(np.ones((2, 3), np.float32)), "half": Tensor([1.0, 2.0], dtype=dtypes.float16)}, path)
    on_disk = safe_load(path, device="DISK")
    assert all(t.device == f"DISK:{path}" for t in on_disk.values())
    assert on_disk["half"].dtype == dtypes.float16 and on_disk["half"].tolist() == [1.0, 2.0]

    class Model:
        def __init__(self) -> None:
            self.weight = Tensor.zeros(2, 3).contiguous().realize()
            self.half = Tensor.zeros(2, dtype=dtypes.float16).contiguous().realize()

    model = Model()
    load_state_dict(model, on_disk)  # DISK values are copied to each parameter's device
    assert model.weight.device == Device.DEFAULT and model.weight.numpy().tolist() == [[1.0] * 3] * 2
    assert model.half.tolist() == [1.0, 2.0]
