"""Datasets: MNIST and Fashion-MNIST in their IDX format, from local files or downloaded once.

mnist() (tensors) and read_mnist() (NumPy arrays, with the dataset's name and folder) look for the four IDX files
(train-images-idx3-ubyte, train-labels-idx1-ubyte, t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each optionally
gzipped) in, in order:

1. the data_dir argument (the files directly in it);
2. $TINY_DATA/mnist or $TINY_DATA/fashion-mnist (the environment variable TINY_DATA names a folder of datasets);
3. the user's cache, <cache>/mnist or <cache>/fashion-mnist, where <cache> is cache_folder():
   $XDG_CACHE_HOME/tiny/datasets, or ~/.cache/tiny/datasets where XDG_CACHE_HOME is not set;
4. /usr/share/datasets/fashion-mnist, where Debian's package installs Fashion-MNIST
   (`apt-get install dataset-fashion-mnist`).

When none has them and download is allowed (the default), it downloads them from the dataset's mirrors into
$TINY_DATA/<name> or, without TINY_DATA, <cache>/<name>, each file to a temporary name first and checked (gzip,
IDX header, sizes, 60000/10000 images of 28x28 with as many labels) before it takes its real name. A download that
fails leaves nothing behind: no partial file, none of the files it fetched, no folder it made. Where the network
does not allow, it raises DatasetNotFound, which says where it looked and how to get the files.
"""

from __future__ import annotations

import gzip
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tiny.ir.config import cache_dir, flag
from tiny.tensor import Tensor

TINY_DATA = flag(
    "TINY_DATA", str, "", "a folder of datasets (mnist/, fashion-mnist/) that tiny.nn.datasets reads first"
)

__all__ = ["IDX_FILES", "MIRRORS", "DatasetNotFound", "MnistData", "cache_folder", "mnist", "read_mnist"]

IDX_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
_IMAGE_MAGIC, _LABEL_MAGIC = 0x00000803, 0x00000801  # IDX: unsigned bytes, 3 dimensions / 1 dimension
# the first ten training labels of each dataset, which tell them apart (their files have the same shapes)
_FIRST_LABELS = {"MNIST": (5, 0, 4, 1, 9, 2, 1, 3, 1, 4), "Fashion-MNIST": (9, 0, 0, 3, 0, 2, 7, 2, 5, 5)}


# where each dataset is published; the first mirror that answers is used
MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": ("https://storage.googleapis.com/cvdf-datasets/mnist/", "https://ossci-datasets.s3.amazonaws.com/mnist/"),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}
_COUNTS = {"train": 60000, "t10k": 10000}


class DatasetNotFound(FileNotFoundError):
    """No folder holds the four IDX files and none could be downloaded. `looked_in` lists the folders searched, in
    order, and `download_failures` what each mirror answered ("mirror: error"; empty where no download was tried)."""

    def __init__(self, message: str, looked_in: tuple[Path, ...], download_failures: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.looked_in = looked_in
        self.download_failures = download_failures


@dataclass(frozen=True)
class MnistData:
    """The four arrays of an MNIST-format dataset, with where they came from. `name` is "MNIST" or "Fashion-MNIST"
    (told apart by the first training labels), or "MNIST-format data" for files that are neither."""

    name: str
    folder: Path
    x_train: np.ndarray  # uint8 (60000, 28, 28)
    y_train: np.ndarray  # uint8 (60000,)
    x_test: np.ndarray  # uint8 (10000, 28, 28)
    y_test: np.ndarray  # uint8 (10000,)


def cache_folder() -> Path:
    """The user's dataset cache: $XDG_CACHE_HOME/tiny/datasets, or ~/.cache/tiny/datasets (as the kernel cache)."""
    return Path(cache_dir()) / "datasets"


def mnist(
    data_dir: str | os.PathLike | None = None, fashion: bool | None = None, download: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X_train, Y_train, X_test, Y_test): images uint8 of shape (N, 1, 28, 28), labels int64 of shape (N,).

    fashion=False takes digit MNIST only, True Fashion-MNIST only, None the first found (digits first).
    Raises DatasetNotFound (a FileNotFoundError) saying where to put the files when none are found and none can be
    downloaded, ValueError for a corrupt file.
    """
    data = read_mnist(data_dir, fashion, download)
    return (
        Tensor(data.x_train[:, None]),
        Tensor(data.y_train.astype(np.int64)),
        Tensor(data.x_test[:, None]),
        Tensor(data.y_test.astype(np.int64)),
    )


def read_mnist(
    data_dir: str | os.PathLike | None = None, fashion: bool | None = None, download: bool = True
) -> MnistData:
    """The dataset mnist() reads, as NumPy arrays (images (N, 28, 28), labels (N,), all uint8) with its name and
    folder; the same arguments and errors as mnist()."""
    try:
        folder = _find(data_dir, fashion)
    except DatasetNotFound as missing:
        if not download or data_dir is not None:
            raise
        folder = _download("fashion-mnist" if fashion else "mnist", missing)
    magics = (_IMAGE_MAGIC, _LABEL_MAGIC, _IMAGE_MAGIC, _LABEL_MAGIC)
    x_train, y_train, x_test, y_test = (
        _read_idx(_path_of(folder, n), m) for n, m in zip(IDX_FILES, magics, strict=True)
    )
    for images, labels, split in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        if images.shape[1:] != (28, 28):
            raise ValueError(f"{folder}: {split} images are {images.shape[1:]}, expected 28x28")
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{folder}: {split} has {images.shape[0]} images but {labels.shape[0]} labels")
    first = tuple(y_train[:10].tolist())
    name = next((n for n, labels in _FIRST_LABELS.items() if labels == first), "MNIST-format data")
    return MnistData(name, folder, x_train, y_train, x_test, y_test)


def _candidates(data_dir: str | os.PathLike | None, fashion: bool | None) -> list[Path]:
    """The folders to look in, in order."""
    if data_dir is not None:
        return [Path(data_dir)]
    subdirs = {False: ["mnist"], True: ["fashion-mnist"], None: ["mnist", "fashion-mnist"]}[fashion]
    bases = [Path(TINY_DATA.value)] if TINY_DATA.value else []
    bases.append(cache_folder())
    out = [base / sub for base in bases for sub in subdirs]
    if fashion is not False:
        out.append(_DEBIAN_FASHION)
    return out


def _find(data_dir: str | os.PathLike | None, fashion: bool | None) -> Path:
    tried = _candidates(data_dir, fashion)
    for folder in tried:
        if all(_path_of(folder, name) is not None for name in IDX_FILES):
            return folder
    looked = "\n".join(f"  {p}" for p in tried)
    raise DatasetNotFound(
        "the MNIST IDX files were not found. Looked in:\n"
        f"{looked}\n"
        f"Each folder needs {', '.join(IDX_FILES)} (optionally .gz). To get them: "
        "`apt-get install dataset-fashion-mnist` (Debian/Ubuntu: Fashion-MNIST in /usr/share/datasets/fashion-mnist), "
        f"or put the four files in {cache_folder()}/mnist (or fashion-mnist), in $TINY_DATA/mnist, "
        "or pass mnist(data_dir=...).",
        tuple(tried),
    )


def _download(name: str, missing: DatasetNotFound) -> Path:
    """Fetch the four files of dataset `name` into the cache, each checked before it is kept; where that fails,
    remove what this call wrote (the files and the folders it made) before raising."""
    folder = (Path(TINY_DATA.value) if TINY_DATA.value else cache_folder()) / name
    made = [p for p in (folder, *folder.parents) if not p.exists()]  # innermost first
    fetched: list[Path] = []
    failures: list[str] = []
    try:
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise _download_failed(name, missing, [f"cannot make the folder {folder}: {e.strerror or e}"]) from None
        for mirror in MIRRORS[name]:
            try:
                for file in IDX_FILES:
                    target = folder / f"{file}.gz"
                    if not target.is_file():
                        _fetch_checked(mirror + f"{file}.gz", target, file)
                        fetched.append(target)
                return folder
            except OSError as e:  # (urllib's URLError is one)
                failures.append(f"{mirror}: {e}")
        raise _download_failed(name, missing, failures)
    except BaseException:
        for path in fetched:
            path.unlink(missing_ok=True)
        for path in made:
            try:
                path.rmdir()
            except OSError:  # not empty (something else wrote there meanwhile), or never made
                if path.exists():
                    break
        raise


def _download_failed(name: str, missing: DatasetNotFound, failures: list[str]) -> DatasetNotFound:
    message = f"{missing}\nDownloading {name} failed:\n" + "\n".join(f"  {f}" for f in failures)
    return DatasetNotFound(message, missing.looked_in, tuple(failures))


def _fetch_checked(url: str, target: Path, file: str) -> None:
    """Download `url` to `target` through a temporary file that is checked before it takes the name, and removed
    when the download or the check fails."""
    partial = target.with_name(target.name + ".part")
    try:
        _fetch(url, partial)
        _check_download(partial, file)
        partial.replace(target)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def _fetch(url: str, path: Path) -> None:
    """Write what `url` serves to `path` (the one place datasets reach the network; tests replace it)."""
    import urllib.request  # (here: with http, ssl and email it maps 2 MB into every process that imports tiny.nn)

    with urllib.request.urlopen(url, timeout=30) as response, path.open("wb") as out:
        shutil.copyfileobj(response, out)


def _check_download(path: Path, file: str) -> None:
    magic = _IMAGE_MAGIC if "images" in file else _LABEL_MAGIC
    data = _read_idx(path, magic, gz=True)
    count = _COUNTS[file.split("-")[0]]
    if data.shape[0] != count or (magic == _IMAGE_MAGIC and data.shape[1:] != (28, 28)):
        raise ValueError(f"{path}: downloaded {file} has shape {data.shape}, expected {count} items")


def _path_of(folder: Path, name: str) -> Path | None:
    for candidate in (folder / name, folder / f"{name}.gz"):
        if candidate.is_file():
            return candidate
    return None


def _read_idx(path: Path | None, expected_magic: int, gz: bool | None = None) -> np.ndarray:
    """The array of an IDX file of unsigned bytes (images: 3-D, labels: 1-D), its header and size checked."""
    assert path is not None
    try:
        raw = (
            gzip.decompress(path.read_bytes())
            if (gz if gz is not None else path.suffix == ".gz")
            else path.read_bytes()
        )
    except (OSError, EOFError) as e:
        raise ValueError(f"{path}: cannot be read as a gzip file: {e}") from None
    if len(raw) < 4:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    magic = int.from_bytes(raw[:4], "big")
    if magic != expected_magic:
        kind = "images" if expected_magic == _IMAGE_MAGIC else "labels"
        raise ValueError(
            f"{path}: magic number {magic:#010x}, expected {expected_magic:#010x} (an IDX file of {kind} as bytes)"
        )
    ndim = magic & 0xFF
    head = 4 + 4 * ndim
    if len(raw) < head:
        raise ValueError(f"{path}: {len(raw)} bytes, too short for its {ndim}-D IDX header")
    shape = tuple(int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    want = head + int(np.prod(shape))
    if len(raw) != want:
        raise ValueError(
            f"{path}: the header says shape {shape} ({want} bytes with the header), the file has {len(raw)} bytes"
            + (" (truncated)" if len(raw) < want else "")
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=head).reshape(shape)
