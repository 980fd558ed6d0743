"""tiny.nn.datasets: MNIST IDX files read and checked, the folders searched (TINY_DATA, the XDG cache), downloads
that are checked and that leave nothing behind when they fail, and which dataset a folder holds."""

from __future__ import annotations

import contextlib
import functools
import gzip
import http.server
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tiny.nn import datasets
from tiny.nn.datasets import DatasetNotFound, cache_folder, mnist, read_mnist
from tiny.tensor import Device, dtypes
from tiny.tensor.checks import default_int

debian_fashion = pytest.mark.skipif(
    not datasets._DEBIAN_FASHION.is_dir(), reason="Debian's dataset-fashion-mnist is not installed"
)


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test has its own empty home folder, with no TINY_DATA and no XDG_CACHE_HOME unless it sets them."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TINY_DATA", raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    return tmp_path / "home"


def write_idx(path: Path, arr: np.ndarray, compress: bool) -> None:
    magic = (0x0800 + arr.ndim).to_bytes(4, "big")
    data = magic + b"".join(n.to_bytes(4, "big") for n in arr.shape) + arr.astype(np.uint8).tobytes()
    if compress:
        path = path.with_name(path.name + ".gz")
        data = gzip.compress(data)
    path.write_bytes(data)


def fake_mnist(
    folder: Path, n_train: int = 5, n_test: int = 3, compress: bool = False, first_labels: tuple[int, ...] = ()
) -> list[np.ndarray]:
    """Write a small random dataset of the four IDX files into `folder` (its training labels starting with
    `first_labels`); returns the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = [
        rng.integers(0, 256, (n_train, 28, 28)),
        rng.integers(0, 10, n_train),
        rng.integers(0, 256, (n_test, 28, 28)),
        rng.integers(0, 10, n_test),
    ]
    arrays[1][: len(first_labels)] = first_labels
    for name, arr in zip(datasets.IDX_FILES, arrays, strict=True):
        write_idx(folder / name, arr, compress)
    return arrays


@pytest.mark.parametrize("compress", [False, True])
def test_mnist_reads_idx_files(tmp_path: Path, compress: bool) -> None:
    arrays = fake_mnist(tmp_path, compress=compress)
    x_train, y_train, x_test, y_test = mnist(tmp_path)
    assert x_train.shape == (5, 1, 28, 28) and x_train.dtype == dtypes.uint8
    assert y_train.shape == (5,) and y_train.dtype == default_int(Device.DEFAULT) and x_test.shape == (3, 1, 28, 28)
    np.testing.assert_array_equal(x_train.numpy()[:, 0], arrays[0])
    np.testing.assert_array_equal(y_test.numpy(), arrays[3])


def test_mnist_finds_tiny_data_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake_mnist(tmp_path / "mnist", n_train=2)
    monkeypatch.setenv("TINY_DATA", str(tmp_path))
    assert mnist(fashion=False)[0].shape == (2, 1, 28, 28)


def test_the_cache_follows_xdg_cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    assert cache_folder() == home / ".cache" / "tiny" / "datasets"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_folder() == tmp_path / "xdg" / "tiny" / "datasets"
    fake_mnist(tmp_path / "xdg" / "tiny" / "datasets" / "mnist", n_train=4)
    fake_mnist(home / ".cache" / "tiny" / "datasets" / "mnist", n_train=2)  # not looked at while XDG_CACHE_HOME is set
    data = read_mnist(fashion=False, download=False)
    assert data.folder == tmp_path / "xdg" / "tiny" / "datasets" / "mnist" and data.x_train.shape == (4, 28, 28)
    monkeypatch.setenv("XDG_CACHE_HOME", "")  # empty means unset, as for the kernel cache
    assert read_mnist(fashion=False, download=False).x_train.shape == (2, 28, 28)
    monkeypatch.setattr(datasets, "_DEBIAN_FASHION", tmp_path / "not-installed")
    with pytest.raises(DatasetNotFound, match="Looked in") as missing:
        read_mnist(fashion=True, download=False)
    assert home / ".cache" / "tiny" / "datasets" / "fashion-mnist" in missing.value.looked_in


def test_mnist_corrupt_files_raise(tmp_path: Path) -> None:
    fake_mnist(tmp_path)
    images = tmp_path / "train-images-idx3-ubyte"
    good = images.read_bytes()
    images.write_bytes(good[:-10])
    with pytest.raises(ValueError, match="truncated"):
        mnist(tmp_path)
    images.write_bytes(b"\x00\x00\x08\x01" + good[4:])
    with pytest.raises(ValueError, match="magic"):
        mnist(tmp_path)


def test_mnist_missing_says_how_to_get_files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TINY_DATA", str(tmp_path))
    with pytest.raises(FileNotFoundError, match="apt-get install dataset-fashion-mnist") as missing:
        mnist(fashion=False, download=False)
    assert missing.value.looked_in == (tmp_path / "mnist", cache_folder() / "mnist")
    assert missing.value.download_failures == () and not str(missing.value).startswith("mnist:")
    monkeypatch.setitem(datasets.MIRRORS, "mnist", ("http://127.0.0.1:9/",))  # nothing listens there
    with pytest.raises(FileNotFoundError, match=r"(?s)apt-get install dataset-fashion-mnist.*Downloading mnist failed"):
        mnist(fashion=False)
    with pytest.raises(FileNotFoundError, match="not found"):
        mnist(tmp_path / "nowhere")


@pytest.mark.parametrize(
    ("first_labels", "name"),
    [
        ((5, 0, 4, 1, 9, 2, 1, 3, 1, 4), "MNIST"),
        ((9, 0, 0, 3, 0, 2, 7, 2, 5, 5), "Fashion-MNIST"),
        ((), "MNIST-format"),
    ],
)
def test_the_dataset_is_told_by_its_first_labels(tmp_path: Path, first_labels: tuple[int, ...], name: str) -> None:
    fake_mnist(tmp_path / "some-folder", n_train=12, first_labels=first_labels)
    data = read_mnist(tmp_path / "some-folder")
    assert data.name.startswith(name) and data.folder == tmp_path / "some-folder", data.name


@debian_fashion
def test_mnist_debian_fashion() -> None:
    x_train, y_train, x_test, y_test = mnist(datasets._DEBIAN_FASHION)
    assert x_train.shape == (60000, 1, 28, 28) and x_test.shape == (10000, 1, 28, 28)
    assert y_train.shape == (60000,) and sorted(set(y_test.numpy().tolist())) == list(range(10))
    assert read_mnist(datasets._DEBIAN_FASHION).name == "Fashion-MNIST"


class _FlakyMirror:
    """A stand-in for datasets._fetch serving the files of `folder` gzipped, which writes half of `broken` and then
    fails as a dropped connection would."""

    def __init__(self, folder: Path, broken: str) -> None:
        self.folder, self.broken, self.asked = folder, broken, []

    def __call__(self, url: str, path: Path) -> None:
        name = url.rsplit("/", 1)[1]
        self.asked.append(name)
        data = gzip.compress((self.folder / name.removesuffix(".gz")).read_bytes())
        if name == self.broken:
            path.write_bytes(data[: len(data) // 2])
            raise ConnectionResetError("the connection was reset")
        path.write_bytes(data)


@pytest.mark.parametrize("broken", ["train-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"])
def test_a_failed_download_leaves_nothing_behind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, broken: str) -> None:
    fake_mnist(tmp_path / "source", n_train=6, n_test=4)
    monkeypatch.setitem(datasets._COUNTS, "train", 6)
    monkeypatch.setitem(datasets._COUNTS, "t10k", 4)
    monkeypatch.setitem(datasets.MIRRORS, "mnist", ("http://first/", "http://second/"))
    mirror = _FlakyMirror(tmp_path / "source", broken)
    monkeypatch.setattr(datasets, "_fetch", mirror)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    with pytest.raises(DatasetNotFound, match="Downloading mnist failed") as failed:
        read_mnist(fashion=False)
    failures = failed.value.download_failures
    assert [f.split(": ", 1)[0] for f in failures] == ["http://first/", "http://second/"], failures
    assert all("the connection was reset" in f for f in failures), failures
    assert mirror.asked.count(broken) == 2  # both mirrors tried
    assert not (tmp_path / "xdg").exists()  # no partial file, no file fetched before the failure, no folder it made
    (tmp_path / "xdg" / "tiny").mkdir(parents=True)
    (tmp_path / "xdg" / "tiny" / "cache.db").write_bytes(b"")
    with pytest.raises(DatasetNotFound):
        read_mnist(fashion=False)
    assert sorted(p.name for p in (tmp_path / "xdg" / "tiny").iterdir()) == ["cache.db"]  # kept what it did not make
    mirror.broken = ""
    data = read_mnist(fashion=False)
    assert data.folder == tmp_path / "xdg" / "tiny" / "datasets" / "mnist" and data.x_train.shape == (6, 28, 28)
    assert sorted(p.name for p in data.folder.iterdir()) == sorted(f"{f}.gz" for f in datasets.IDX_FILES)


@contextlib.contextmanager
def _serve(folder: Path) -> Iterator[str]:
    """An HTTP server on localhost serving `folder`, as a dataset mirror."""
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()


@debian_fashion
def test_mnist_downloads_and_checks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    source = datasets._DEBIAN_FASHION  # served as a mirror; not found where mnist() looks
    monkeypatch.setattr(datasets, "_DEBIAN_FASHION", tmp_path / "not-installed")
    monkeypatch.setenv("TINY_DATA", str(tmp_path / "data"))
    with _serve(source) as url:
        monkeypatch.setitem(datasets.MIRRORS, "fashion-mnist", ("http://127.0.0.1:9/", url))  # the first is down
        x_train, _, x_test, y_test = mnist(fashion=True)
    assert x_train.shape == (60000, 1, 28, 28) and x_test.shape == (10000, 1, 28, 28)
    kept = sorted(p.name for p in (tmp_path / "data" / "fashion-mnist").iterdir())
    assert kept == sorted(f"{f}.gz" for f in datasets.IDX_FILES)
    bad = tmp_path / "bad"
    bad.mkdir()
    for f in datasets.IDX_FILES:  # a mirror whose test labels are cut short
        data = (source / f"{f}.gz").read_bytes()
        (bad / f"{f}.gz").write_bytes(gzip.compress(gzip.decompress(data)[:-100]) if f.startswith("t10k-l") else data)
    monkeypatch.setenv("TINY_DATA", str(tmp_path / "other"))
    with _serve(bad) as url:
        monkeypatch.setitem(datasets.MIRRORS, "fashion-mnist", (url,))
        with pytest.raises(ValueError, match="truncated"):
            mnist(fashion=True)
    assert not (tmp_path / "other").exists()  # neither the bad file nor the three good ones before it, nor the folder


def test_a_cache_folder_that_cannot_be_made(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a-file").write_bytes(b"")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "a-file"))
    monkeypatch.setattr(datasets, "_fetch", lambda url, path: pytest.fail(f"fetched {url}"))
    with pytest.raises(DatasetNotFound, match="Downloading mnist failed") as failed:
        read_mnist(fashion=False)
    assert failed.value.download_failures == (
        f"cannot make the folder {tmp_path / 'a-file' / 'tiny' / 'datasets' / 'mnist'}: Not a directory",
    )
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
