"""Gadget-4 HDF5 snapshots and initial conditions: one file per process, serial h5py.

Layout (as Gadget-4's own writer makes it): ``snapdir_XXX/snapshot_XXX.{rank}.hdf5``
with ``/Header``, ``/Parameters`` and ``/PartType1`` (``Coordinates``,
``Velocities``, ``ParticleIDs``); each process writes the particles its
devices hold, nothing is gathered. The dark matter is particle type 1; its
mass is ``MassTable[1]``.

Units on disk (Gadget's defaults, so that readers without unit metadata, such
as yt, report the right numbers): lengths in kpc/h comoving
(``UnitLength_in_cm`` = 3.0857e21), masses in 1e10 Msun/h, velocities in
km/s with Gadget's cosmological convention u = v_pec / sqrt(a) (``a_scaling``
0.5 on ``Velocities``). distpm converts at this boundary only:
x [kpc/h] = 1000 pos [Mpc/h]; v_pec [km/s] = 100 p / a from the canonical
momentum p = ``vel`` [100 km/s], so u = 100 p / a^1.5.
``ParticleIDs`` are the Lagrangian indices plus one (uint64, 1-based).
Every dataset carries HDF5's Fletcher32 checksums (:mod:`distpm.io.checksums`):
a damaged chunk is refused by whoever reads it.
"""

from __future__ import annotations

from pathlib import Path

import jax
import numpy as np

from distpm import shares
from distpm.io import checksums, partial
from distpm.parallel import runtime
from distpm.state import Particles, linear_ids
from distpm.units import MASS_G, MPC_CM, particle_mass

UNIT_LENGTH_CM = MPC_CM / 1000.0  # kpc: positions on disk are in kpc/h
UNIT_MASS_G = MASS_G  # 1e10 Msun (/h)
UNIT_VELOCITY_CM_S = 1e5  # km/s
N_TYPES = 6
DM = 1  # Gadget's particle type of the dark matter


def unit_attributes(length=0.0, mass=0.0, velocity=0.0, a=0.0, h=0.0, to_cgs=0.0) -> dict:
    """Gadget-4's per-dataset unit attributes: value [cgs] = x a^a h^h to_cgs."""
    return {
        "length_scaling": length,
        "mass_scaling": mass,
        "velocity_scaling": velocity,
        "a_scaling": a,
        "h_scaling": h,
        "to_cgs": to_cgs,
    }


COORDINATE_UNITS = unit_attributes(length=1.0, a=1.0, h=-1.0, to_cgs=UNIT_LENGTH_CM)
VELOCITY_UNITS = unit_attributes(velocity=1.0, a=0.5, to_cgs=UNIT_VELOCITY_CM_S)
ID_UNITS = unit_attributes()


def scale_factor(particles: Particles, cfg) -> float:
    """The particles' a as a float64: the time-grid value it was rounded from, if any."""
    a = float(particles.a)
    grid = np.concatenate([cfg.time_grid, [cfg.a_start, cfg.a_stop]])
    nearest = grid[np.argmin(np.abs(grid - a))]
    return float(nearest) if abs(nearest - a) <= 1e-6 * a else a


def time_and_cosmology(a: float, cosmo, cfg) -> dict:
    """The /Header attributes of snapshots and group files alike: time, box, cosmology."""
    return {
        "Time": np.float64(a),
        "Redshift": np.float64(1.0 / a - 1.0),
        "BoxSize": np.float64(cfg.box_size[0] * 1000.0),
        "Omega0": np.float64(cosmo.Omega_m),
        "OmegaLambda": np.float64(cosmo.Omega_de),
        "HubbleParam": np.float64(cosmo.h),
    }


def header(
    n_this_file: int, n_total: int, n_files: int, a: float, cosmo, cfg, double=False
) -> dict:
    """/Header attributes (Gadget-4's, plus the cosmology for older readers)."""
    this = np.zeros(N_TYPES, np.uint64)
    total = np.zeros(N_TYPES, np.uint64)
    masses = np.zeros(N_TYPES, np.float64)
    this[DM], total[DM], masses[DM] = n_this_file, n_total, particle_mass(cosmo, cfg)
    return {
        "NumPart_ThisFile": this,
        "NumPart_Total": total,
        "NumPart_Total_HighWord": np.zeros(N_TYPES, np.uint32),
        "MassTable": masses,
        **time_and_cosmology(a, cosmo, cfg),
        "NumFilesPerSnapshot": np.int32(n_files),
        "Flag_DoublePrecision": np.int32(double),
    }


def parameters(n_files: int, cosmo, cfg, base: str) -> dict:
    """/Parameters attributes: the run's cosmology and units, as Gadget-4 writes them."""
    return {
        "Omega0": np.float64(cosmo.Omega_m),
        "OmegaLambda": np.float64(cosmo.Omega_de),
        "OmegaBaryon": np.float64(cosmo.Omega_b),
        "HubbleParam": np.float64(cosmo.h),
        "Hubble": np.float64(0.1),  # H0 in internal units (km/s per kpc)
        "BoxSize": np.float64(cfg.box_size[0] * 1000.0),
        "UnitLength_in_cm": np.float64(UNIT_LENGTH_CM),
        "UnitMass_in_g": np.float64(UNIT_MASS_G),
        "UnitVelocity_in_cm_per_s": np.float64(UNIT_VELOCITY_CM_S),
        "ComovingIntegrationOn": np.int32(1),
        "PeriodicBoundariesOn": np.int32(1),
        "TimeBegin": np.float64(cfg.a_start),
        "TimeMax": np.float64(cfg.a_stop),
        "NumFilesPerSnapshot": np.int32(n_files),
        "SnapshotFileBase": base,
    }


def _local(particles: Particles, name: str) -> np.ndarray:
    """This process's blocks of the field ``name``, concatenated in block order."""
    return np.concatenate([b for _, b in runtime.local_blocks(getattr(particles, name))])


def local_ids(particles: Particles, cfg) -> np.ndarray:
    """This process's valid particles' ParticleIDs (Lagrangian index + 1, uint64), in the
    order its snapshot file holds them."""
    mask = _local(particles, "mask")
    return linear_ids(_local(particles, "ids")[mask], cfg.particle_shape).astype(np.uint64) + 1


def local_particles(particles: Particles, cfg, a: float, dtype):
    """This process's valid particles in disk units: (x [kpc/h], u [km/s], ids 1-based)."""
    mask = _local(particles, "mask")
    pos = _local(particles, "pos")[mask].astype(np.float64) * 1000.0
    vel = _local(particles, "vel")[mask].astype(np.float64) * (100.0 / a**1.5)
    box = cfg.box_size[0] * 1000.0
    pos = pos.astype(dtype)
    pos = np.where(pos >= box, pos - box, pos)  # [0, L) after rounding to the file's precision
    return pos, vel.astype(dtype), local_ids(particles, cfg)


def check_cubic(cfg):
    if len(set(cfg.box_size)) != 1:
        raise ValueError(
            f"Gadget files hold one BoxSize: box_size {cfg.box_size} must be cubic to write them"
        )


def write_snapshot(
    directory,
    particles: Particles,
    cosmo,
    cfg,
    *,
    number: int | None = 0,
    base="snapshot",
    double=False,
) -> Path:
    """Write ``particles`` as a Gadget-4 HDF5 snapshot; return the snapshot's base path.

    Files: ``directory/{base}_{number:03d}.{rank}.hdf5`` (``{base}.{rank}.hdf5``
    if number is None), one per process, each
    holding the particles of that process's devices (no gathering). Every
    process must call this (the total count is summed over processes).
    double: write coordinates and velocities in float64 (exact round trip of
    float32 state, as for initial conditions); otherwise float32, as
    Gadget-4's snapshots by default.
    """

    check_cubic(cfg)
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stem = base if number is None else f"{base}_{number:03d}"
    rank, n_files = jax.process_index(), jax.process_count()
    a = scale_factor(particles, cfg)
    dtype = np.float64 if double else np.float32
    pos, vel, ids = local_particles(particles, cfg, a, dtype)
    n_total = runtime.process_sum(len(ids))
    attrs = header(len(ids), n_total, n_files, a, cosmo, cfg, double)
    path = directory / f"{stem}.{rank}.hdf5"

    def fill(f):
        f.create_group("Header").attrs.update(attrs)
        f.create_group("Parameters").attrs.update(parameters(n_files, cosmo, cfg, base))
        group = f.create_group(f"PartType{DM}")
        for name, data, units in (
            ("Coordinates", pos, COORDINATE_UNITS),
            ("Velocities", vel, VELOCITY_UNITS),
            ("ParticleIDs", ids, ID_UNITS),
        ):
            checksums.create(group, name, data).attrs.update(units)

    partial.write_hdf5(path, fill)
    runtime.barrier(f"snapshot {stem} written")
    return directory / stem


# ---- reading ------------------------------------------------------------------


def snapshot_files(path) -> list[Path]:
    """The files of a snapshot, in rank order, from any of: its directory, one of its
    files, or its base path (``snapdir_000/snapshot_000``). Raises if one is missing."""
    import re

    path = Path(path)
    if path.is_dir():
        firsts = sorted(path.glob("*.0.hdf5")) or sorted(path.glob("*.hdf5"))
        if len(firsts) != 1:
            found = ", ".join(p.name for p in firsts) or "no .hdf5 file"
            raise ValueError(
                f"{path}: expected one Gadget snapshot in the directory, found {found}"
            )
        path = firsts[0]
    match = re.fullmatch(r"(.*)\.(\d+)\.hdf5", path.name)
    if match:
        base = path.with_name(match.group(1))
    elif path.suffix == ".hdf5":
        base = None  # a single-file snapshot
    else:
        base = path
        if not base.with_name(base.name + ".0.hdf5").exists():
            path = base.with_name(base.name + ".hdf5")
            base = None
    first = path if base is None else base.with_name(base.name + ".0.hdf5")
    if not first.exists():
        raise ValueError(f"snapshot file {first} does not exist")
    n_files = int(_read_header(first)["NumFilesPerSnapshot"])
    if base is None:
        if n_files != 1:
            raise ValueError(f"{first} is one of {n_files} files; pass the snapshot's directory")
        return [first]
    files = [base.with_name(f"{base.name}.{i}.hdf5") for i in range(n_files)]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise ValueError(
            f"snapshot {base} has {n_files} files (NumFilesPerSnapshot) but {missing} are missing"
        )
    return files


def _open(path):
    import h5py

    try:
        return h5py.File(path, "r")
    except OSError as err:
        reason = str(err).split("(")[-1].rstrip(")") if "(" in str(err) else str(err)
        raise ValueError(f"{path}: not a readable HDF5 file ({reason})") from None


def _read_header(path) -> dict:
    """/Header and /Parameters attributes of a Gadget HDF5 file, checked for what distpm needs."""
    with _open(path) as f:
        if "Header" not in f:
            raise ValueError(f"{path}: not a Gadget snapshot (no /Header group)")
        out = dict(f["Header"].attrs)
        params = dict(f["Parameters"].attrs) if "Parameters" in f else {}
        needed = ["NumPart_ThisFile", "NumPart_Total", "MassTable", "Time", "BoxSize"]
        lacking = [k for k in needed + ["NumFilesPerSnapshot"] if k not in out]
        if "NumFilesPerSnapshot" in lacking and "NumFiles" not in lacking:
            lacking.remove("NumFilesPerSnapshot")
            out["NumFilesPerSnapshot"] = out.get("NumFiles", 1)
        if lacking:
            raise ValueError(f"{path}: not a Gadget snapshot (/Header lacks {lacking})")
        counts = np.asarray(out["NumPart_ThisFile"], np.int64)
        others = [t for t in range(len(counts)) if t != DM and counts[t] > 0]
        if others:
            raise ValueError(
                f"{path} holds particles of type {others}; distpm reads dark matter "
                f"(PartType{DM}) only"
            )
        if counts[DM] > 0:
            group = f.get(f"PartType{DM}")
            for name in ("Coordinates", "Velocities", "ParticleIDs"):
                if group is None or name not in group:
                    raise ValueError(f"{path}: PartType{DM}/{name} is missing")
                if group[name].shape[0] != counts[DM]:
                    raise ValueError(
                        f"{path}: PartType{DM}/{name} has {group[name].shape[0]} rows but the "
                        f"header says {counts[DM]} (truncated file?)"
                    )
    out["UnitLength_in_cm"] = float(params.get("UnitLength_in_cm", UNIT_LENGTH_CM))
    out["UnitVelocity_in_cm_per_s"] = float(
        params.get("UnitVelocity_in_cm_per_s", UNIT_VELOCITY_CM_S)
    )
    return out


def header_of(path) -> dict:
    """The /Header (and units) of a snapshot's first file, checked as :func:`read_snapshot`
    checks it, without reading particles."""
    return _read_header(snapshot_files(path)[0])


def _read_rows(files, counts, start: int, stop: int) -> dict:
    """Rows [start, stop) of the concatenated files' PartType1 datasets."""
    offsets = np.concatenate([[0], np.cumsum(counts)])
    parts = {"Coordinates": [], "Velocities": [], "ParticleIDs": []}
    for i, path in enumerate(files):
        lo, hi = max(start, offsets[i]), min(stop, offsets[i + 1])
        if lo >= hi:
            continue
        with _open(path) as f:
            group = f[f"PartType{DM}"]
            for name in parts:
                rows = slice(lo - offsets[i], hi - offsets[i])
                parts[name].append(checksums.read(group[name], rows))
    return {k: np.concatenate(v) if v else None for k, v in parts.items()}


def read_snapshot(path, cfg) -> Particles:
    """Particles from a Gadget HDF5 snapshot or IC file, on ``cfg``'s device grid.

    path: the snapshot's directory, one of its files or its base path.
    Every process reads an even share of the particles (only those rows),
    then the particles move to the devices that own their positions, as
    after a drift. The file's units are read from ``/Parameters`` (Gadget's
    kpc/h and km/s when absent); ``a`` is the file's ``Time``. Raises ValueError for a
    file that does not fit ``cfg`` (particle count, box size).
    """
    cfg.check_runnable()
    files = snapshot_files(path)
    headers = [_read_header(f) for f in files]
    first = headers[0]
    counts = [int(h["NumPart_ThisFile"][DM]) for h in headers]
    total = int(first["NumPart_Total"][DM]) + (
        int(first.get("NumPart_Total_HighWord", np.zeros(N_TYPES))[DM]) << 32
    )
    if sum(counts) != total:
        raise ValueError(
            f"{files[0]}: the files hold {sum(counts)} particles but NumPart_Total says {total}"
        )
    if total != cfg.n_particles:
        raise ValueError(
            f"{files[0]} holds {total} particles but particle_shape {cfg.particle_shape} "
            f"has {cfg.n_particles}"
        )
    to_mpc = first["UnitLength_in_cm"] / MPC_CM
    box = float(first["BoxSize"]) * to_mpc
    if any(abs(box - b) > 1e-6 * b for b in cfg.box_size):
        raise ValueError(f"{files[0]} has BoxSize {box} Mpc/h but box_size is {cfg.box_size}")
    a = float(first["Time"])
    to_canonical = a**1.5 / 100.0 * first["UnitVelocity_in_cm_per_s"] / UNIT_VELOCITY_CM_S
    plane = cfg.particle_shape[1] * cfg.particle_shape[2]

    def read_rows(start, stop):
        rows = _read_rows(files, counts, start, stop)
        linear = rows["ParticleIDs"].astype(np.int64) - 1
        if len(linear) and (linear.min() < 0 or linear.max() >= total):
            raise ValueError(f"{files[0]}: ParticleIDs must lie in [1, {total}] (1-based)")
        return {
            "pos": rows["Coordinates"].astype(np.float64) * to_mpc,
            "vel": rows["Velocities"].astype(np.float64) * to_canonical,
            "ids": np.stack(np.divmod(linear, plane), axis=1),
        }

    return shares.from_rows(read_rows, total, a, cfg)
