"""Checkpoints: a run's full state, per process, that a kill at any moment cannot spoil.

``OUT/checkpoints/step_NNNNN/`` holds ``rank_R.h5`` per process (the raw
per-device buffers of every field of :class:`distpm.Particles`, padding and
mask included, at full precision) and ``COMPLETE``, a JSON record of the
step, the time grid, the config, the cosmology, the layout and the versions.
The momenta are stored as the run holds them: between its steps they are
kicked ahead to the next step's midpoint (merged kicks, see
:mod:`distpm.nbody.schedule`), which the record says (``momenta_kicked_ahead``),
so that a resumed run goes on exactly as the uninterrupted one.

Writing: every process writes into ``.step_NNNNN.partial/`` and syncs its
file to disk; after a barrier, process 0 writes ``COMPLETE`` last (synced),
renames the directory and only then deletes older checkpoints. A checkpoint
is valid when ``COMPLETE`` and every rank file exist, so at every moment of
a write at least one valid checkpoint is on disk (the old one until the new
one is complete). Checkpoints need a file system that all processes share.

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
import time
from pathlib import Path

import jax
import numpy as np

from distpm import shares
from distpm.parallel import devices, runtime
from distpm.parallel.decomposition import SLOTS, Decomposition, ParallelOptions
from distpm.state import Particles
from distpm.version import __version__

DIRECTORY = "checkpoints"
MARKER = "COMPLETE"
FIELDS = ("pos", "vel", "ids", "mask")
PARALLEL_KEYS = tuple(f.name for f in dataclasses.fields(ParallelOptions))


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
    out_dir, state: Particles, step: int, cosmo, cfg, output=None, kicked: bool = False
) -> Path:
    """Write ``state`` after ``step`` steps to ``out_dir/checkpoints``; every process calls it.

    output: the run's :class:`distpm.runfile.OutputConfig`, stored so that a
    resumed run goes on writing the same files. kicked: the momenta are
    kicked ahead to step ``step``'s midpoint (True between the steps of
    ``distpm run``), not at the state's time. Returns the checkpoint's
    directory. Older checkpoints are deleted once this one is complete.
    """
    import h5py

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
    with h5py.File(path, "w") as f:
        f.attrs["blocks"] = np.asarray([b for b, _ in blocks["mask"]], np.int64)
        f.attrs["counts"] = np.asarray([int(m.sum()) for _, m in blocks["mask"]], np.int64)
        for field, items in blocks.items():
            f.create_dataset(field, data=np.concatenate([x for _, x in items]))
    _fsync(path)
    runtime.barrier(f"checkpoint {name}: rank files")
    final = root / name
    if main:
        settings, dec = physics(cfg, cosmo), Decomposition.of(cfg)
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
        for old in root.iterdir():
            if old != final and (old.name.startswith("step_") or old.name.endswith(".partial")):
                shutil.rmtree(old, ignore_errors=True)
    runtime.barrier(f"checkpoint {name}: complete")
    return final


def _versions() -> dict:
    return {"distpm": __version__, "jax": jax.__version__, "numpy": np.__version__}


def _record(directory: Path) -> dict | None:
    """The COMPLETE record of a checkpoint directory if it is valid, else None."""
    return None if _problem(directory) else json.loads((directory / MARKER).read_text())


def _problem(directory: Path) -> str | None:
    """Why ``directory`` is not a valid checkpoint (None if it is one)."""
    try:
        record = json.loads((directory / MARKER).read_text())
    except OSError:
        return f"{directory.name} has no {MARKER} marker (its write was interrupted)"
    except ValueError:
        return f"{directory.name}/{MARKER} is not valid JSON"
    missing = [
        f"rank_{r}.h5"
        for r in range(record.get("processes", 1))
        if not (directory / f"rank_{r}.h5").exists()
    ]
    return f"{directory.name} lacks {', '.join(missing)}" if missing else None


def latest(path) -> Path:
    """The newest valid checkpoint in a run's output directory (or ``path`` itself if it is one)."""
    path = Path(path)
    if (path / MARKER).exists():
        if _problem(path):
            raise ValueError(f"checkpoint {path} is not usable: {_problem(path)}")
        return path
    root = path / DIRECTORY
    dirs = sorted(d for d in root.iterdir() if d.is_dir()) if root.is_dir() else []
    found = [d for d in dirs if not _problem(d)]
    if not found:
        why = "; ".join(_problem(d) for d in dirs) or f"looked in {root}"
        raise ValueError(f"no complete checkpoint in {path} ({why})")
    return max(found, key=lambda d: _record(d)["step"])


def run_directory(path) -> Path:
    """The output directory of the run that a checkpoint (or run directory) belongs to."""
    path = Path(path)
    return path.parent.parent if path.parent.name == DIRECTORY else path


def stored_settings(path) -> dict:
    """The run-file values (config, ``cosmology`` and ``output`` tables) of the newest
    checkpoint under ``path``."""
    record = _record(latest(path))
    config = dict(record["config"])
    flat = {k: config.pop(k) for k in PARALLEL_KEYS if k in config}  # written before [parallel]
    config["parallel"] = {**config.get("parallel", {}), **flat}
    cosmology = {"preset": "planck18", **record["cosmology"]}
    return {**config, "cosmology": cosmology, "output": dict(record["output"])}


def check_physics(record: dict, cfg, cosmo, where) -> None:
    """Raise one line naming what differs if ``cfg``/``cosmo`` change the checkpoint's physics."""
    now, then = physics(cfg, cosmo), record["physics"]
    differ = sorted(k for k in set(now) | set(then) if now.get(k) != then.get(k))
    if differ:
        first = differ[0]
        more = f" (and {len(differ) - 1} more: {', '.join(differ[1:])})" if len(differ) > 1 else ""
        raise ValueError(
            f"checkpoint {where} was made with {first}={then.get(first)!r} but the config has "
            f"{first}={now.get(first)!r}{more}; resume with the run's own config "
            "(only its [parallel] options may change)"
        )


def read_checkpoint(path, cosmo, cfg) -> tuple[Particles, int, bool]:
    """(state, step, kicked) from the newest valid checkpoint under ``path``, on ``cfg``'s
    device grid; kicked: the momenta are kicked ahead (see :func:`write_checkpoint`).

    Raises ValueError if the config or cosmology differ from the checkpoint's
    in anything but the layout options.
    """
    cfg.check_runnable()
    directory = latest(path)
    record = _record(directory)
    check_physics(record, cfg, cosmo, directory)
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
