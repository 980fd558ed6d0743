"""Datasets: MNIST and Fashion-MNIST in their IDX format, from local files or downloaded once.

mnist() looks for the four IDX files (train-images-idx3-ubyte, train-labels-idx1-ubyte,
t10k-images-idx3-ubyte, t10k-labels-idx1-ubyte, each optionally gzipped) in, in order:

1. the data_dir argument (the files directly in it);
2. $TINY_DATA/mnist or $TINY_DATA/fashion-mnist (the environment variable TINY_DATA names a folder of datasets);
3. ~/.cache/tiny/datasets/mnist or ~/.cache/tiny/datasets/fashion-mnist;
4. /usr/share/datasets/fashion-mnist, where Debian's package installs Fashion-MNIST
   (`apt-get install dataset-fashion-mnist`).

When none has them and download is allowed (the default), it downloads them from the dataset's mirrors into
~/.cache/tiny/datasets/<name> (or $TINY_DATA/<name>), each file to a temporary name first and checked (gzip,
IDX header, sizes, 60000/10000 images of 28x28 with as many labels) before it takes its real name; where the
network does not allow, it stops with a message that says how to get the files.
"""

from __future__ import annotations

import gzip
import os
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np

from tiny.ir.config import TINY_DATA
from tiny.tensor import Tensor

_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
_DEBIAN_FASHION = Path("/usr/share/datasets/fashion-mnist")
_IMAGE_MAGIC, _LABEL_MAGIC = 0x00000803, 0x00000801  # IDX: unsigned bytes, 3 dimensions / 1 dimension


# where each dataset is published; the first mirror that answers is used
MIRRORS: dict[str, tuple[str, ...]] = {
    "mnist": ("https://storage.googleapis.com/cvdf-datasets/mnist/", "https://ossci-datasets.s3.amazonaws.com/mnist/"),
    "fashion-mnist": ("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
}
_COUNTS = {"train": 60000, "t10k": 10000}


def mnist(
    data_dir: str | os.PathLike | None = None, fashion: bool | None = None, download: bool = True
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(X_train, Y_train, X_test, Y_test): images uint8 of shape (N, 1, 28, 28), labels int64 of shape (N,).

    fashion=False takes digit MNIST only, True Fashion-MNIST only, None the first found (digits first).
    Raises FileNotFoundError saying where to put the files when none are found and none can be downloaded,
    ValueError for a corrupt file.
    """
    try:
        folder = _find(data_dir, fashion)
    except FileNotFoundError as missing:
        if not download or data_dir is not None:
            raise
        folder = _download("fashion-mnist" if fashion else "mnist", missing)
    magics = (_IMAGE_MAGIC, _LABEL_MAGIC, _IMAGE_MAGIC, _LABEL_MAGIC)
    x_train, y_train, x_test, y_test = (_read_idx(_path_of(folder, n), m) for n, m in zip(_FILES, magics, strict=True))
    for images, labels, split in ((x_train, y_train, "train"), (x_test, y_test, "t10k")):
        if images.shape[1:] != (28, 28):
            raise ValueError(f"{folder}: {split} images are {images.shape[1:]}, expected 28x28")
        if images.shape[0] != labels.shape[0]:
            raise ValueError(f"{folder}: {split} has {images.shape[0]} images but {labels.shape[0]} labels")
    return (
        Tensor(x_train[:, None]),
        Tensor(y_train.astype(np.int64)),
        Tensor(x_test[:, None]),
        Tensor(y_test.astype(np.int64)),
    )


def _candidates(data_dir: str | os.PathLike | None, fashion: bool | None) -> list[Path]:
    """The folders to look in, in order."""
    if data_dir is not None:
        return [Path(data_dir)]
    subdirs = {False: ["mnist"], True: ["fashion-mnist"], None: ["mnist", "fashion-mnist"]}[fashion]
    bases = [Path(TINY_DATA.value)] if TINY_DATA.value else []
    bases.append(Path.home() / ".cache" / "tiny" / "datasets")
    out = [base / sub for base in bases for sub in subdirs]
    if fashion is not False:
        out.append(_DEBIAN_FASHION)
    return out


def _find(data_dir: str | os.PathLike | None, fashion: bool | None) -> Path:
    tried = _candidates(data_dir, fashion)
    for folder in tried:
        if all(_path_of(folder, name) is not None for name in _FILES):
            return folder
    looked = "\n".join(f"  {p}" for p in tried)
    raise FileNotFoundError(
        "mnist: the MNIST IDX files were not found. Looked in:\n"
        f"{looked}\n"
        f"Each folder needs {', '.join(_FILES)} (optionally .gz). To get them: "
        "`apt-get install dataset-fashion-mnist` (Debian/Ubuntu: Fashion-MNIST in /usr/share/datasets/fashion-mnist), "
        "or put the four files in ~/.cache/tiny/datasets/mnist (or fashion-mnist), in $TINY_DATA/mnist, "
        "or pass mnist(data_dir=...)."
    )


def _download(name: str, missing: FileNotFoundError) -> Path:
    """Fetch the four files of dataset `name` into the cache, each checked before it is kept."""
    base = Path(TINY_DATA.value) if TINY_DATA.value else Path.home() / ".cache" / "tiny" / "datasets"
    folder = base / name
    folder.mkdir(parents=True, exist_ok=True)
    failures = []
    for mirror in MIRRORS[name]:
        try:
            for file in _FILES:
                target = folder / f"{file}.gz"
                if target.is_file():
                    continue
                partial = target.with_suffix(".gz.part")
                with urllib.request.urlopen(mirror + f"{file}.gz", timeout=30) as response:
                    partial.write_bytes(response.read())
                try:
                    _check_download(partial, file)
                except ValueError:
                    partial.unlink()
                    raise
                partial.rename(target)
            return folder
        except (OSError, urllib.error.URLError) as e:
            failures.append(f"  {mirror}: {e}")
    raise FileNotFoundError(f"{missing}\nDownloading {name} failed:\n" + "\n".join(failures)) from None


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
