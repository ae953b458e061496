"""Checksums of the files distpm writes, so that damaged data is refused, never used.

The files handed on (snapshots, initial conditions, group catalogues) have
every dataset written with HDF5's Fletcher32 filter: a checksum per chunk that
the HDF5 library checks on every read, so h5py, yt, pynbody and Gadget-4 refuse
a damaged chunk unaided. A checkpoint, which only distpm reads, has instead the
SHA-256 of each rank file in its COMPLETE record: it covers the attributes and
metadata too, is checked before a resume allocates anything
(:mod:`distpm.io.checkpoint`), and costs a third of the filter's time
(``benchmarks/io.md``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import numpy as np


def create(group, name: str, data):
    """``group[name]`` holding ``data``, chunked (h5py's choice) with Fletcher32 checksums."""
    return group.create_dataset(name, data=data, fletcher32=True)


def read(dataset, selection=()) -> np.ndarray:
    """``dataset[selection]``; a chunk whose checksum fails raises one line naming the file
    and the dataset (HDF5's own message names neither)."""
    try:
        return np.asarray(dataset[selection])
    except OSError as err:
        if "filter returned failure" not in str(err):  # HDF5's words for a checksum mismatch
            raise
        where = f"{dataset.file.filename}: dataset {dataset.name}"
        raise OSError(f"{where} is damaged (its Fletcher32 checksum fails)") from None


def sha256(path) -> str:
    """The SHA-256 of a file's bytes, as hex."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for block in iter(lambda: f.read(1 << 24), b""):
            digest.update(block)
    return digest.hexdigest()
