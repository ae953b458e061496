"""Gadget-4 group catalogues (``fof_subhalo_tab``) with a snapshot whose groups are contiguous.

:func:`write_groups` writes, as Gadget-4 does after FoF, a snapshot in
which the members of every group are consecutive, and a catalogue whose
offsets index that snapshot:

- ``snapdir_XXX/snapshot_XXX.{rank}.hdf5`` (:func:`distpm.io.write_snapshot`):
  the particles of group 0 first, then group 1, ..., then the particles in
  no group; inside each, by ParticleID. Groups are in the catalogue's
  order (most members first, equal sizes by label), so the files are the
  same on any device grid or process count.
- ``groups_XXX/fof_subhalo_tab_XXX.{rank}.hdf5``: ``/Header``, ``/Group``
  (one row per group), an empty ``/Subhalo`` and ``/IDs/ID`` (the members'
  ParticleIDs in snapshot order; ``/Group`` also carries the attribute
  ``NTask``, the number of files, which pynbody reads). File r holds the groups whose first
  member is in snapshot file r, and the IDs of the group members in
  snapshot file r, so no process gathers particles.

Units as in the snapshot (:mod:`distpm.io.gadget`): lengths in kpc/h
comoving, masses in 1e10 Msun/h. ``Group_M_Mean200``, ``Group_R_Mean200``,
``Group_M_Crit200`` and ``Group_R_Crit200`` are distpm's spherical-overdensity
masses and comoving radii around the centre of mass (Gadget-4's SUBFIND centres
them on the potential minimum; see :mod:`distpm.analysis.overdensity`).
``GroupVel`` follows Gadget-4, which averages its internal velocities a^2 dx/dt:
it is a times the peculiar velocity [km/s] (divide by a for v_pec; its
``a_scaling`` is -1). yt's reader of these files assumes Mpc/h unless told: load them with
``unit_base={"UnitLength_in_cm": 3.0856775814913673e21, "UnitVelocity_in_cm_per_s": 1e5}``.

distpm's extra fields, under their own names: ``DistpmLabel`` (the
smallest member ParticleID), ``DistpmVelDisp`` (1-D velocity dispersion
[km/s]), ``DistpmRadiusRMS`` [kpc/h] and ``DistpmLagrangianPos`` [kpc/h].
"""

from __future__ import annotations

import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from distpm.analysis.morton import sort_by_keys
from distpm.io import checksums, gadget, partial
from distpm.parallel import runtime
from distpm.parallel.decomposition import SLOTS, Decomposition

NO_GROUP = 0xFFFFFFFE  # the high key word of particles in no group (0xFFFFFFFF marks empty slots)

MASS_UNITS = gadget.unit_attributes(mass=1.0, h=-1.0, to_cgs=gadget.UNIT_MASS_G)
KM_S = gadget.UNIT_VELOCITY_CM_S
VELOCITY_UNITS = gadget.unit_attributes(velocity=1.0, to_cgs=KM_S)
GROUP_VELOCITY_UNITS = gadget.unit_attributes(velocity=1.0, a=-1.0, to_cgs=KM_S)


def _label_table(catalogue, cfg):
    """The catalogue's labels as id words sorted lexicographically, padded to a power of two,
    and the catalogue row of each: ((m, 2) int32, (m,) int32)."""
    plane = cfg.particle_shape[1] * cfg.particle_shape[2]
    words = np.stack(np.divmod(catalogue.label.astype(np.int64), plane), axis=1)
    order = np.lexsort((words[:, 1], words[:, 0]))
    size = 1 << max(0, len(order) - 1).bit_length()
    table = np.full((size, 2), np.iinfo(np.int32).max, np.int64)
    rows = np.zeros(size, np.int64)
    table[: len(order)], rows[: len(order)] = words[order], order
    return table.astype(np.int32), rows.astype(np.int32)


def _lower_bound(table, keys):
    """Index of the first row of ``table`` (m, 2), sorted lexicographically, that is not
    below each key (n, 2): a bisection of fixed length."""
    lo = jnp.zeros(keys.shape[0], jnp.int32)
    hi = jnp.full(keys.shape[0], table.shape[0], jnp.int32)
    for _ in range(table.shape[0].bit_length()):
        active = lo < hi
        mid = (lo + hi) // 2
        entry = table[jnp.minimum(mid, table.shape[0] - 1)]
        same = entry[:, 0] == keys[:, 0]
        below = (entry[:, 0] < keys[:, 0]) | (same & (entry[:, 1] < keys[:, 1]))
        lo = jnp.where(active & below, mid + 1, lo)
        hi = jnp.where(active & ~below, mid, hi)
    return lo


@functools.partial(jax.jit, static_argnames=("cfg",))
def _group_keys(particles, labels, table, rows, cfg):
    """Sort keys (catalogue row, low word of the ParticleID) per slot; and the number of
    labelled slots whose label is not in the table (must be 0)."""
    plane = cfg.particle_shape[1] * cfg.particle_shape[2]

    def local(ids, mask, labels, table, rows):
        at = jnp.minimum(_lower_bound(table, labels), table.shape[0] - 1)
        grouped = mask & (labels[:, 0] >= 0)
        found = jnp.all(table[at] == labels, axis=1)
        number = jnp.where(grouped, rows[at].astype(jnp.uint32), jnp.uint32(NO_GROUP))
        low = ids[:, 0].astype(jnp.uint32) * jnp.uint32(plane) + ids[:, 1].astype(jnp.uint32)
        lost = Decomposition.of(cfg).mesh.device_sum(jnp.sum(grouped & ~found, dtype=jnp.int32))
        return jnp.stack([number, low], axis=1), lost

    specs = (SLOTS, SLOTS, SLOTS, P(), P())
    return Decomposition.of(cfg).sharded(local, specs, (SLOTS, P()))(
        particles.ids, particles.mask, labels, table, rows
    )


def in_group_order(particles, labels, catalogue, cfg):
    """The particles sorted as the snapshot of :func:`write_groups` holds them, with
    device d holding the ranks [floor(d N / P), floor((d + 1) N / P))."""
    table, rows = _label_table(catalogue, cfg)
    keys, lost = _group_keys(particles, labels, jnp.asarray(table), jnp.asarray(rows), cfg)
    if int(lost):
        raise ValueError(
            f"{int(lost)} particles carry labels that are not in the catalogue: pass the "
            "catalogue made from these labels (distpm.halo_catalogue)"
        )
    ordered, _ = sort_by_keys(particles, keys, cfg, balance=True)
    return ordered


def header(cat, n_groups: int, n_ids: int, n_files: int, cosmo, cfg) -> dict:
    """/Header attributes of one catalogue file (Gadget-4's, plus the Arepo names).

    The counts are int64, where Gadget-4 writes uint64 (HDF5 converts them on
    reading): yt's reader of several files subtracts them from signed indices,
    which numpy turns into floats for uint64.
    """
    count = np.int64
    return {
        "Ngroups_ThisFile": count(n_groups),
        "Ngroups_Total": count(len(cat)),
        "Nsubhalos_ThisFile": count(0),
        "Nsubhalos_Total": count(0),
        "Nsubgroups_ThisFile": count(0),
        "Nsubgroups_Total": count(0),
        "Nids_ThisFile": count(n_ids),
        "Nids_Total": count(int(cat.n.sum())),
        "NumFiles": np.int32(n_files),
        **gadget.time_and_cosmology(cat.a, cosmo, cfg),
    }


def group_fields(cat, rows, offsets) -> dict:
    """/Group datasets of the catalogue rows ``rows``: {name: (data, unit attributes)}."""
    n, dm = cat.n[rows], gadget.DM
    per_type = lambda x, dtype: np.zeros((len(x), gadget.N_TYPES), dtype)  # noqa: E731
    length_type, offset_type = per_type(n, np.int32), per_type(n, np.int64)
    mass_type = per_type(n, np.float32)
    length_type[:, dm], offset_type[:, dm], mass_type[:, dm] = n, offsets[rows], cat.mass[rows]
    kpc = lambda x: (1000.0 * x[rows]).astype(np.float32)  # noqa: E731
    none, length = gadget.ID_UNITS, gadget.COORDINATE_UNITS
    return {
        "GroupLen": (n.astype(np.int32), none),
        "GroupLenType": (length_type, none),
        "GroupOffsetType": (offset_type, none),
        "GroupMass": (cat.mass[rows].astype(np.float32), MASS_UNITS),
        "GroupMassType": (mass_type, MASS_UNITS),
        "GroupPos": (kpc(cat.pos), length),
        "GroupVel": ((cat.a * cat.vel[rows]).astype(np.float32), GROUP_VELOCITY_UNITS),
        "GroupAscale": (np.full(len(n), cat.a, np.float32), none),
        "GroupNsubs": (np.zeros(len(n), np.int32), none),
        "GroupFirstSub": (np.full(len(n), -1, np.int64), none),
        "Group_M_Mean200": (cat.m200m[rows].astype(np.float32), MASS_UNITS),
        "Group_R_Mean200": (kpc(cat.r200m), length),
        "Group_M_Crit200": (cat.m200c[rows].astype(np.float32), MASS_UNITS),
        "Group_R_Crit200": (kpc(cat.r200c), length),
        "DistpmLabel": (cat.label[rows].astype(np.uint64) + np.uint64(1), none),
        "DistpmVelDisp": (cat.sigma_v[rows].astype(np.float32), VELOCITY_UNITS),
        "DistpmRadiusRMS": ((1000.0 * cat.r_rms[rows]).astype(np.float32), length),
        "DistpmLagrangianPos": (kpc(cat.lagrangian_pos), length),
    }


def write_groups(out_dir, particles, labels, catalogue, cosmo, cfg, *, number=0, double=False):
    """Write a snapshot in group order and its Gadget-4 group catalogue; their base paths.

    particles, labels: as given to :func:`distpm.halo_catalogue`, which made
    ``catalogue``. Files: ``out_dir/snapdir_XXX/snapshot_XXX.{rank}.hdf5``
    and ``out_dir/groups_XXX/fof_subhalo_tab_XXX.{rank}.hdf5`` (see the
    module doc), one of each per process. Every process must call this.
    double: float64 snapshot coordinates and velocities.
    """

    gadget.check_cubic(cfg)
    n, p, members = particles.count, Decomposition.of(cfg).n_devices, int(catalogue.n.sum())
    if members > n:
        raise ValueError("the catalogue has more members than there are particles")
    ordered = in_group_order(particles, labels, catalogue, cfg)
    out = Path(out_dir)
    snapshot = gadget.write_snapshot(
        out / f"snapdir_{number:03d}", ordered, cosmo, cfg, number=number, double=double
    )
    # this process's rows of the snapshot: its blocks' ranks (blocks follow jax.devices(),
    # which lists the devices process by process)
    blocks = runtime.local_blocks(ordered.mask)
    first, last = blocks[0][0], blocks[-1][0]
    start, stop = first * n // p, (last + 1) * n // p
    held = [b for b, _ in blocks]
    if held != list(range(first, last + 1)):
        raise RuntimeError(f"this process's devices hold blocks {held}, not consecutive ones")
    ids = gadget.local_ids(ordered, cfg)
    if len(ids) != stop - start:
        raise RuntimeError(f"{len(ids)} snapshot rows on this process, expected {stop - start}")
    offsets = (np.cumsum(catalogue.n) - catalogue.n).astype(np.int64)
    rows = np.flatnonzero((offsets >= start) & (offsets < stop))
    member_ids = ids[: max(0, min(stop, members) - start)]
    rank, n_files = jax.process_index(), jax.process_count()
    directory = out / f"groups_{number:03d}"
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"fof_subhalo_tab_{number:03d}"
    path = directory / f"{stem}.{rank}.hdf5"

    def fill(f):
        attrs = header(catalogue, len(rows), len(member_ids), n_files, cosmo, cfg)
        f.create_group("Header").attrs.update(attrs)
        group = f.create_group("Group")
        group.attrs["NTask"] = np.int32(n_files)  # where pynbody looks for the file count
        for name, (data, units) in group_fields(catalogue, rows, offsets).items():
            checksums.create(group, name, data).attrs.update(units)
        f.create_group("Subhalo")
        checksums.create(f.create_group("IDs"), "ID", member_ids).attrs.update(gadget.ID_UNITS)

    partial.write_hdf5(path, fill)
    runtime.barrier(f"group catalogue {stem} written")
    return snapshot, directory / stem
