"""Checkpoints: a run's full state, per process, that a kill at any moment cannot spoil.

``OUT/checkpoints/step_NNNNN/`` holds ``rank_R.h5`` per process (the raw
per-device buffers of every field of :class:`distpm.Particles`, padding and
mask included, at full precision) and ``COMPLETE``, a JSON record of the
step, the time grid, the config, the cosmology, the layout and the versions.
The momenta are stored as the run holds them: between its steps they are
kicked ahead to the next step's midpoint (merged kicks, see
:mod:`distpm.nbody.schedule`), which the record says (``momenta_kicked_ahead``),
so that a resumed run goes on exactly as the uninterrupted one.

Writing: every process writes into ``.step_NNNNN.partial/``, syncs its
file to disk and leaves its SHA-256 beside it; after a barrier, process 0
writes ``COMPLETE`` last (synced, with every rank file's SHA-256), renames the
directory and only then deletes checkpoints older than the newest
``keep`` (two by default). A checkpoint is complete when ``COMPLETE``
exists, so at every moment of a write at least one complete checkpoint is on
disk. Checkpoints need a file system that all processes share.

Resuming (:func:`choose`): the newest complete checkpoint is verified
(every rank file present and equal to its SHA-256; the processes share the
hashing) before anything is read or allocated. A damaged one is refused in
one line, or, with ``fallback``, set aside for the newest one that verifies
(:mod:`distpm.io.checksums`).

Reading back on the same device grid and process count restores the
buffers exactly (a resumed run is bitwise the uninterrupted one); on another
layout, the valid particles are read in even shares and sent to their
owners (the result then agrees to float32 round-off).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

import jax
import numpy as np

from distpm import shares
from distpm.io import checksums
from distpm.io import partial as partial_file
from distpm.parallel import devices, runtime
from distpm.parallel.decomposition import SLOTS, Decomposition, ParallelOptions
from distpm.state import Particles
from distpm.version import __version__

DIRECTORY = "checkpoints"
MARKER = "COMPLETE"
FIELDS = ("pos", "vel", "ids", "mask")
PARALLEL_KEYS = tuple(f.name for f in dataclasses.fields(ParallelOptions))
# the output options a resume may change: when checkpoints are written and how many are kept
SCHEDULE_KEYS = ("checkpoint_every", "checkpoint_minutes", "keep_checkpoints")


def physics(cfg, cosmo) -> dict:
    """The settings that fix a run's physics: the config but its parallel options (they
    change where particles live, not what they do), and the cosmology."""
    values = {k: v for k, v in cfg.to_dict().items() if k != "parallel"}
    values = json.loads(json.dumps(values))  # tuples as lists, as stored
    return {**values, **{f"cosmology.{k}": v for k, v in _cosmology(cosmo).items()}}


def _cosmology(cosmo) -> dict:
    return {f.name: float(getattr(cosmo, f.name)) for f in dataclasses.fields(cosmo)}


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(
    out_dir, state: Particles, step: int, cosmo, cfg, output=None, kicked=False, halos=None
) -> Path:
    """Write ``state`` after ``step`` steps to ``out_dir/checkpoints``; every process calls it.

    output, halos: the run's :class:`distpm.runfile.OutputConfig` and
    :class:`distpm.runfile.HalosConfig`, stored so that a resumed run goes on
    writing the same files. kicked: the momenta are kicked ahead to step
    ``step``'s midpoint (True between the steps of ``distpm run``), not at
    the state's time. Returns the checkpoint's directory. Once it is
    complete, only the newest ``output.keep_checkpoints`` (default 2) stay.
    """
    root = Path(out_dir) / DIRECTORY
    name = f"step_{step:05d}"
    partial = root / f".{name}.partial"
    main = runtime.is_main_process()
    if main:
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
    runtime.barrier(f"checkpoint {name}: directory")
    rank = jax.process_index()
    path = partial / f"rank_{rank}.h5"
    blocks = {f: runtime.local_blocks(getattr(state, f)) for f in FIELDS}

    def fill(f):
        f.attrs["blocks"] = np.asarray([b for b, _ in blocks["mask"]], np.int64)
        f.attrs["counts"] = np.asarray([int(m.sum()) for _, m in blocks["mask"]], np.int64)
        for field, items in blocks.items():
            # no Fletcher32 here: the file's SHA-256 covers it, at a third of the filter's cost
            f.create_dataset(field, data=np.concatenate([x for _, x in items]))

    partial_file.write_hdf5(path, fill)  # a full disk: one line, and no COMPLETE
    _fsync(path)
    (partial / f"rank_{rank}.sha256").write_text(checksums.sha256(path))
    runtime.barrier(f"checkpoint {name}: rank files")
    final = root / name
    if main:
        settings, dec = physics(cfg, cosmo), Decomposition.of(cfg)
        digests = {}
        for r in range(jax.process_count()):
            side = partial / f"rank_{r}.sha256"
            digests[f"rank_{r}.h5"] = side.read_text()
            side.unlink()
        record = {
            "step": step,
            "a": float(cfg.time_grid[step]),
            "momenta_kicked_ahead": bool(kicked),
            "time_grid": [float(a) for a in cfg.time_grid],
            "physics": settings,
            "physics_sha256": hashlib.sha256(
                json.dumps(settings, sort_keys=True).encode()
            ).hexdigest(),
            "config": json.loads(json.dumps(cfg.to_dict())),
            "cosmology": _cosmology(cosmo),
            "output": dataclasses.asdict(output) if output is not None else {},
            "halos": dataclasses.asdict(halos) if halos is not None else {},
            "sha256": digests,
            "device_grid": list(dec.grid),
            "capacity": dec.capacity,
            "processes": jax.process_count(),
            "deterministic": devices.is_deterministic(),
            "platform": jax.default_backend(),
            "versions": _versions(),
            "written": time.strftime("%Y-%m-%dT%H:%M:%S"),
        }
        marker = partial / MARKER
        marker.write_text(json.dumps(record, indent=1))
        _fsync(marker)
        _fsync(partial)
        if final.exists():
            shutil.rmtree(final)
        os.replace(partial, final)
        _fsync(root)
        keep = output.keep_checkpoints if output is not None else 2
        kept = sorted(d for d in root.iterdir() if d.name.startswith("step_"))[-keep:]
        for old in root.iterdir():
            if old not in kept and (old.name.startswith("step_") or old.name.endswith(".partial")):
                shutil.rmtree(old, ignore_errors=True)
    runtime.barrier(f"checkpoint {name}: complete")
    return final


def _versions() -> dict:
    return {"distpm": __version__, "jax": jax.__version__, "numpy": np.__version__}


def _record(directory: Path) -> dict:
    return json.loads((directory / MARKER).read_text())


def _problem(directory: Path) -> str | None:
    """Why a checkpoint with a ``COMPLETE`` record is not usable (None if it is): the record
    unreadable or a rank file missing."""
    try:
        record = _record(directory)
    except ValueError:
        return f"{directory.name}/{MARKER} is not valid JSON"
    missing = [
        f"rank_{r}.h5"
        for r in range(record.get("processes", 1))
        if not (directory / f"rank_{r}.h5").exists()
    ]
    return f"{directory.name} lacks {', '.join(missing)}" if missing else None


_VERIFIED: set[Path] = set()  # checkpoints this process has seen verified (hashed once)


def _damaged(directory: Path) -> str | None:
    """Which rank file differs from the SHA-256 its record holds (None if none does, or the
    record predates checksums). Every process calls it: each hashes its share of the files."""
    if directory.resolve() in _VERIFIED:
        return None
    digests = _record(directory).get("sha256", {})
    names = sorted(digests)
    bad = np.zeros(len(names), np.int32)
    for i in range(jax.process_index(), len(names), jax.process_count()):
        bad[i] = checksums.sha256(directory / names[i]) != digests[names[i]]
    bad = runtime.process_max(bad)
    if not bad.any():
        _VERIFIED.add(directory.resolve())
        return None
    files = ", ".join(n for n, b in zip(names, bad, strict=True) if b)
    return f"{directory.name}/{files} does not match the SHA-256 in its {MARKER} record"


def choose(path, fallback: bool = False) -> Path:
    """The checkpoint to resume from: the newest complete one in a run's output directory
    (or ``path`` itself if it is one), verified. One that is damaged (a rank file missing or
    unlike its SHA-256) raises, or with ``fallback`` is passed over for the newest that
    verifies, which process 0 says on stderr. Every process calls it."""
    path = Path(path)
    root = path / DIRECTORY
    if (path / MARKER).exists():
        found = [path]
    else:
        found = [d for d in root.iterdir() if (d / MARKER).exists()] if root.is_dir() else []
        found.sort(key=lambda d: d.name, reverse=True)  # step_NNNNN: the newest first
    if not found:
        raise ValueError(f"no complete checkpoint in {path} (looked in {root})")
    passed = []
    for directory in found:
        why = _problem(directory) or _damaged(directory)
        if why is None:
            _set_aside(passed, directory)
            return directory
        if not fallback:
            raise ValueError(
                f"checkpoint {directory} is damaged: {why}; --fallback resumes from the "
                "newest checkpoint that verifies"
            )
        passed.append((directory, why))
    raise ValueError(f"no checkpoint in {path} verifies: {'; '.join(w for _, w in passed)}")


def _set_aside(damaged: list, chosen: Path) -> None:
    """Rename the damaged checkpoints a fallback passed over to ``damaged_step_NNNNN`` (kept
    for inspection, never resumed from or deleted by distpm), and say so."""
    if not damaged:
        return
    if runtime.is_main_process():
        for directory, why in damaged:
            aside = directory.with_name(f"damaged_{directory.name}")
            shutil.rmtree(aside, ignore_errors=True)
            os.replace(directory, aside)
            print(f"distpm: {why}: moved to {aside.name}", file=sys.stderr)
        print(f"distpm: resuming from {chosen}", file=sys.stderr)
    runtime.barrier("checkpoint: damaged ones set aside")


def run_directory(path) -> Path:
    """The output directory of the run that a checkpoint (or run directory) belongs to."""
    path = Path(path)
    return path.parent.parent if path.parent.name == DIRECTORY else path


def stored_settings(path, fallback: bool = False) -> dict:
    """The run-file values (config, ``cosmology``, ``output`` and ``halos`` tables) of the
    checkpoint :func:`choose` takes under ``path``."""
    record = _record(choose(path, fallback))
    config = dict(record["config"])
    flat = {k: config.pop(k) for k in PARALLEL_KEYS if k in config}  # written before [parallel]
    config["parallel"] = {**config.get("parallel", {}), **flat}
    cosmology = {"preset": "planck18", **record["cosmology"]}
    halos = {"halos": dict(record["halos"])} if record.get("halos") else {}
    return {**config, "cosmology": cosmology, "output": dict(record["output"]), **halos}


def _table(name: str, values: dict) -> dict:
    """A table's settings as ``name.key``, less the checkpoint schedule (a resume may change
    it)."""
    return {f"{name}.{k}": v for k, v in values.items() if k not in SCHEDULE_KEYS}


def check_same_run(record: dict, cfg, cosmo, where, output=None, halos=None) -> None:
    """Raise one line naming every setting that differs if ``cfg``, ``cosmo`` (and
    ``output``, ``halos`` where given and stored) are not the checkpoint's run's: only the
    [parallel] options and the checkpoint schedule may change on a resume."""
    now, then = physics(cfg, cosmo), dict(record["physics"])
    for name, mine in (("output", output), ("halos", halos)):
        if mine is not None and record.get(name):
            now |= _table(name, json.loads(json.dumps(dataclasses.asdict(mine))))
            then |= _table(name, record[name])
    differ = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
    if differ:
        first = differ[0]
        more = f" (and {len(differ) - 1} more: {', '.join(differ[1:])})" if len(differ) > 1 else ""
        raise ValueError(
            f"checkpoint {where} was made with {first}={then.get(first)!r} but the config has "
            f"{first}={now.get(first)!r}{more}; resume with the run's own config "
            "(only its [parallel] options and when checkpoints are written may change)"
        )


def resumable(path, cfg, cosmo, output, halos, fallback: bool = False) -> Path:
    """The checkpoint a run resumes from (:func:`choose`), refused if it is not that run's
    (:func:`check_same_run`)."""
    directory = choose(path, fallback)
    check_same_run(_record(directory), cfg, cosmo, directory, output, halos)
    return directory


def read_checkpoint(path, cosmo, cfg, fallback: bool = False) -> tuple[Particles, int, bool]:
    """(state, step, kicked) from the checkpoint :func:`choose` takes under ``path`` (verified),
    on ``cfg``'s device grid; kicked: the momenta are kicked ahead (see
    :func:`write_checkpoint`).

    Raises ValueError if the config or cosmology differ from the checkpoint's
    in anything but the layout options.
    """
    cfg.check_runnable()
    directory = choose(path, fallback)
    record = _record(directory)
    check_same_run(record, cfg, cosmo, directory)
    _warn_if_not_bitwise(record, directory)
    kicked = bool(record.get("momenta_kicked_ahead", False))
    dec = Decomposition.of(cfg)
    if (
        record["device_grid"] == list(dec.grid)
        and record["capacity"] == dec.capacity
        and record["processes"] == jax.process_count()
    ):
        state = _read_exact(directory / f"rank_{jax.process_index()}.h5", record["a"], cfg)
        if state is not None:
            return state, record["step"], kicked
    return _read_regrouped(directory, record, cfg), record["step"], kicked


def _warn_if_not_bitwise(record: dict, where) -> None:
    """Warn where a resume on a GPU cannot continue the run bitwise: the checkpoint's run or
    this one without deterministic mode (see :func:`distpm.parallel.devices.set_deterministic`)."""
    then, now = record.get("platform", "cpu"), jax.default_backend()
    if then == now == "cpu":  # XLA's CPU backend adds in a fixed order
        return
    both = record.get("deterministic", False) and devices.is_deterministic()
    if then != now or not both:  # another platform adds in another order
        import warnings

        warnings.warn(
            f"resuming {where} (made on {then}) on {now}: the result will equal an "
            "uninterrupted run to round-off, not bitwise, unless both runs are on the same "
            "platform and deterministic (distpm run --deterministic)",
            stacklevel=3,
        )


def _read_exact(path, a, cfg) -> Particles | None:
    """This process's buffers as they were written, if it holds the same blocks as then."""
    import h5py

    dec = Decomposition.of(cfg)
    sharding = dec.sharding(SLOTS)
    cap, n_slots = dec.capacity, dec.slots
    with h5py.File(path, "r") as f:
        stored = [int(b) for b in f.attrs["blocks"]]
        if stored != runtime.local_block_indices((n_slots,), sharding):
            return None
        arrays = {}
        for field in FIELDS:
            data = np.asarray(f[field])
            blocks = {b: data[i * cap : (i + 1) * cap] for i, b in enumerate(stored)}
            arrays[field] = runtime.from_local_blocks(blocks, (n_slots,) + data.shape[1:], sharding)
    return Particles(**arrays, a=np.asarray(a, cfg.float_dtype))


def _read_regrouped(directory, record, cfg) -> Particles:
    """The checkpoint's valid particles in even shares per device, then sent to their owners."""
    import h5py

    files = [directory / f"rank_{r}.h5" for r in range(record["processes"])]
    pieces = []  # (file, first row of the block, its slots, valid count) in file order
    for path in files:
        with h5py.File(path, "r") as f:
            cap = f["mask"].shape[0] // max(1, len(f.attrs["blocks"]))
            pieces += [(path, i * cap, cap, int(c)) for i, c in enumerate(f.attrs["counts"])]
    offsets = np.concatenate([[0], np.cumsum([c for *_, c in pieces])])

    def read_rows(start, stop):
        out = {f: [np.zeros((0, 2 if f == "ids" else 3))] for f in FIELDS if f != "mask"}
        for (path, row, cap, _), lo, hi in zip(pieces, offsets[:-1], offsets[1:], strict=True):
            first, last = max(start, lo), min(stop, hi)
            if first < last:
                with h5py.File(path, "r") as f:
                    # a block's valid particles may sit in any of its slots
                    valid = np.flatnonzero(f["mask"][row : row + cap])[first - lo : last - lo]
                    span = slice(row + valid[0], row + valid[-1] + 1)
                    for field, parts in out.items():
                        parts.append(np.asarray(f[field][span])[valid - valid[0]])
        return {field: np.concatenate(parts) for field, parts in out.items()}

    return shares.from_rows(read_rows, int(offsets[-1]), record["a"], cfg)
