"""A run's output folder: one run's outputs at a time, marked incomplete until the run ends.

``distpm run`` claims its folder before it writes anything (:class:`Claim`):

- a folder that holds another run's outputs (the names in :data:`OUTPUTS`, but for the files
  the run reads) is refused in one line, unless the run resumes that run (``--resume`` of the
  same folder) or is told to replace them (``overwrite``: they are deleted first, and
  nothing else in the folder);
- process 0 holds an exclusive lock on ``.distpm.lock`` for the whole run (``flock``: the
  operating system lets it go when the process ends, however it ends), so a second run
  writing into the same folder is refused while the first one lives;
- ``INCOMPLETE`` says, from the claim until the summary is written, that the folder's
  outputs are not all there (a run that is going on, failed or was killed). A folder that
  holds only that marker held nothing of value and is reused without a word.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import socket
import time
from pathlib import Path

from distpm.parallel import runtime

LOCK = ".distpm.lock"
INCOMPLETE = "INCOMPLETE"
# what a run writes (pipeline.run and what it calls), as glob patterns
OUTPUTS = (
    "summary.json", "power*.txt", "power*.png", "density*.png", "density.npy",
    "white_noise.npy", "multipoles*", "snapdir_*", "groups_*", "halos.*",
    "mass_function.png", "lightcone", "checkpoints",
)  # fmt: skip


def outputs_in(out: Path, inputs=()) -> list[str]:
    """The names in ``out`` that a run writes, sorted, but for the run's own ``inputs`` (e.g.
    a linear power table named power.txt kept there)."""
    mine = {Path(p).resolve() for p in inputs}
    found = {p for pattern in OUTPUTS for p in out.glob(pattern)}
    return sorted(p.name for p in found if p.resolve() not in mine)


class Claim:
    """The claim of a run on its output folder (see the module's notes); every process makes
    it, process 0 alone touches the folder. ``release`` once the outputs are complete."""

    def __init__(self, out, *, resuming=False, overwrite=False, inputs=()):
        self.out = Path(out)
        self._lock = None
        try:
            runtime.main_decides(lambda: self._claim(resuming, overwrite, inputs))
        except ValueError:
            self.release(complete=False)  # its lock, if it took one
            raise

    def _claim(self, resuming: bool, overwrite: bool, inputs) -> None:
        out = self.out
        if out.exists() and not out.is_dir():
            raise ValueError(f"--out {out} is a file, not a folder")
        out.mkdir(parents=True, exist_ok=True)
        self._lock = (out / LOCK).open("a+")
        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._lock.seek(0)
            holder = self._lock.read().strip() or "another process"
            self._lock.close()
            self._lock = None  # the other run's, not ours to remove
            raise ValueError(
                f"another distpm run is writing into {out} ({holder}); wait for it to end or "
                "choose another --out"
            ) from None
        self._lock.seek(0)
        self._lock.truncate()
        self._lock.write(f"pid {os.getpid()} on {socket.gethostname()} since {time.ctime()}\n")
        self._lock.flush()
        found = outputs_in(out, inputs)
        if found and not resuming:
            if not overwrite:
                shown = ", ".join(found[:4]) + (f" and {len(found) - 4} more" if found[4:] else "")
                raise ValueError(
                    f"{out} holds another run's outputs ({shown}); choose another --out, "
                    f"give --overwrite to replace them, or --resume {out} to go on with that run"
                )
            for name in found:
                path = out / name
                shutil.rmtree(path) if path.is_dir() else path.unlink()
        (out / INCOMPLETE).write_text(
            "a distpm run is writing here, or stopped before it ended: its outputs are not "
            f"all here (started {time.ctime()})\n"
        )

    def release(self, complete: bool = True) -> None:
        """Let the folder go (and remove the lock file); with outputs not ``complete`` (the
        run failed), the marker stays."""
        if self._lock is not None:
            if complete:
                (self.out / INCOMPLETE).unlink(missing_ok=True)
            (self.out / LOCK).unlink(missing_ok=True)  # ours: we hold its flock
            self._lock.close()  # the flock goes with the file
            self._lock = None
