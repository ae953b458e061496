"""Files written under a temporary name, moved into place only when complete.

A reader never finds half a file under its real name; a write that fails (a full disk,
where h5py raises a RuntimeError as it closes the file) leaves nothing behind and raises
one line that names the file.
"""

from __future__ import annotations

import contextlib
import errno
import os
import shutil
import sys
from pathlib import Path


def reason(err: BaseException) -> str:
    """One line of why a write failed ("No space left on device" where the disk is full)."""
    text = str(err)
    if getattr(err, "errno", None) == errno.ENOSPC or f"errno = {errno.ENOSPC}" in text:
        return os.strerror(errno.ENOSPC)
    return text.strip().splitlines()[0] if text.strip() else type(err).__name__


@contextlib.contextmanager
def writing(path):
    """Yield ``path.partial`` to write; moved to ``path`` when the block ends. If the block
    fails, the temporary file is removed: an OSError or RuntimeError (what h5py raises on a
    full disk) becomes an OSError of one line naming ``path``; anything else (a bug, Ctrl-C)
    goes on as it is."""
    path = Path(path)
    temporary = path.with_name(path.name + ".partial")
    try:
        yield temporary
    except (OSError, RuntimeError) as err:
        temporary.unlink(missing_ok=True)
        raise OSError(f"could not write {path}: {reason(err)}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)


@contextlib.contextmanager
def opened(path):
    """:func:`writing`, with the temporary file open for binary writes: for numpy's save,
    savez and savetxt (given a name, the first two would add their suffix to it)."""
    with writing(path) as temporary, open(temporary, "wb") as f:
        yield f


def write_text(path, text: str) -> None:
    """Write ``text`` to ``path`` through :func:`writing`."""
    with writing(path) as temporary:
        temporary.write_text(text)


def write_hdf5(path, fill) -> None:
    """Write an HDF5 file at ``path`` (through :func:`writing`): ``fill(f)`` writes into it."""
    with writing(path) as temporary:
        _fill(temporary, fill)


def _fill(temporary, fill) -> None:
    import h5py

    with h5py.File(temporary, "w") as f:
        fill(f)


def quiet_unwritable(unraisable, fallback=sys.unraisablehook) -> None:
    """An unraisable hook that drops what h5py's objects of a file that met a full disk say as
    they are collected (their unwritten data, one traceback each: :func:`writing` has said
    it in one line); anything else goes to ``fallback``."""
    err = unraisable.exc_value
    if isinstance(err, OSError) and "h5py" in repr(unraisable.object) and "errno = 28" in str(err):
        return
    fallback(unraisable)


def check_space(folder, needed: float, what: str) -> None:
    """Raise one line if ``folder``'s file system has less than ``needed`` bytes free."""
    free = shutil.disk_usage(folder).free
    if free < needed:
        raise OSError(
            f"{folder} has {free / 1e6:.3g} MB free but {what} need about {needed / 1e6:.3g} MB; "
            "free some space or choose another --out"
        )
