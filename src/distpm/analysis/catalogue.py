"""Halo catalogue: the properties of each labelled group, from members on any devices.

Each device sums, for every group label it holds, its members' count and
moments about a reference member (positions as periodic minimum images, so
a group across the box boundary is whole). The partial sums travel to the
label's home device (:func:`distpm.parallel.migrate.by_key`), where they are moved to
a common reference and added. Positions, velocities and the Lagrangian
positions of the members (from their ids) give, per group:

- ``n``: members; ``mass`` [1e10 Msun/h] = n times the particle mass;
- ``pos`` [Mpc/h]: centre of mass, wrapped into the box;
- ``vel`` [km/s]: mean peculiar velocity (v = 100 vel / a);
- ``sigma_v`` [km/s]: 1-D velocity dispersion, sqrt(<|v - <v>|^2> / 3);
- ``r_rms`` [Mpc/h]: sqrt(<|x - centre|^2>);
- ``lagrangian_pos`` [Mpc/h]: centre of mass of the members' Lagrangian sites;
- ``label``: the group's label, the smallest member id as a Lagrangian
  index (int64): it indexes ``particles.by_id(...)``;
- ``m200m``, ``r200m``, ``m200c``, ``r200c`` [1e10 Msun/h, Mpc/h comoving]: the
  spherical-overdensity masses and radii around the centre of mass, counting every
  particle (members or not; :mod:`distpm.analysis.overdensity`), searched within twice
  the radius where the group's own mass would be 200 times the mean density.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import warnings
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from distpm.analysis import links, overdensity
from distpm.analysis.links import INT_MAX
from distpm.ops import compact, sorting
from distpm.parallel import migrate, overflow
from distpm.parallel.decomposition import SLOTS, Decomposition
from distpm.parallel.layout import Layout
from distpm.parallel.overflow import Limit
from distpm.parallel.runtime import to_host
from distpm.state import PARTICLES, lagrangian_offset, linear_ids, wrap
from distpm.units import particle_mass

_BLOCK = 1 << 16  # members whose moments are summed at a time


@dataclasses.dataclass(frozen=True)
class HaloCatalogue:
    """One row per group, sorted by mass (descending; equal masses by label).

    label: (n,) int64; n: (n,) int64 members; mass: [1e10 Msun/h]; pos,
    lagrangian_pos: (n, 3) [Mpc/h]; vel: (n, 3) [km/s]; sigma_v [km/s];
    r_rms [Mpc/h]; m200m, m200c [1e10 Msun/h] and r200m, r200c [Mpc/h]: spherical
    overdensity (NaN when not computed); a: the scale factor of the particles.
    """

    label: np.ndarray
    n: np.ndarray
    mass: np.ndarray
    pos: np.ndarray
    vel: np.ndarray
    sigma_v: np.ndarray
    r_rms: np.ndarray
    lagrangian_pos: np.ndarray
    m200m: np.ndarray
    r200m: np.ndarray
    m200c: np.ndarray
    r200c: np.ndarray
    a: float

    def __len__(self) -> int:
        return len(self.n)

    def save(self, stem, opened=None, **about) -> list[str]:
        """Write ``stem.npz`` (the arrays) and ``stem.txt`` (a table with units); the names.

        ``about``: settings to record (linking length, ...), in both files. ``opened(path)``:
        a context manager that yields a binary file to write ``path`` through (default: the
        file itself; :func:`distpm.io.partial.opened` writes it under a temporary name).
        """
        stem = Path(stem)
        opened = opened or functools.partial(open, mode="wb")
        arrays = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        with opened(stem.with_suffix(".npz")) as f:
            np.savez(f, **arrays, **{k: np.asarray(v) for k, v in about.items()})
        header = [
            f"distpm halo catalogue: {len(self)} groups at a = {self.a:.6g}, sorted by mass",
            ", ".join(f"{k} = {v}" for k, v in about.items()),
            "label (smallest member id, Lagrangian index) | n | mass [1e10 Msun/h] | "
            "x y z [Mpc/h] | vx vy vz [km/s] | sigma_v [km/s] | r_rms [Mpc/h] | "
            "lagrangian x y z [Mpc/h] | M200m [1e10 Msun/h] | R200m [Mpc/h] | "
            "M200c [1e10 Msun/h] | R200c [Mpc/h]  (comoving; spherical overdensity around x y z)",
        ]
        columns = [self.label, self.n, self.mass, *self.pos.T, *self.vel.T, self.sigma_v]
        columns += [self.r_rms, *self.lagrangian_pos.T, self.m200m, self.r200m]
        columns += [self.m200c, self.r200c]
        table = np.column_stack([np.asarray(c, np.float64) for c in columns])
        formats = ["%d", "%d", "%.6e"] + ["%.5f"] * 3 + ["%.3f"] * 4 + ["%.5f"] * 4
        formats += ["%.6e", "%.5f"] * 2
        with opened(stem.with_suffix(".txt")) as f:
            np.savetxt(f, table, fmt=formats, header="\n".join(header))
        return [stem.with_suffix(".npz").name, stem.with_suffix(".txt").name]


def _min_image(d, box):
    return d - box * jnp.round(d / box)


def _take(x, index):
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


def _sort_by_label(labels, valid, cfg):
    """Order of the slots by label (lexicographic on the two words), unlabelled last."""
    k0 = jnp.where(valid, labels[:, 0], INT_MAX)
    k1 = jnp.where(valid, labels[:, 1], INT_MAX)
    if cfg.n_particles < 2**31 - 1:  # one int32 key sorts faster than two
        _, ny, nz = cfg.particle_shape
        return sorting.argsort(jnp.where(valid, k0 * (ny * nz) + k1, INT_MAX))
    return sorting.argsort(k0, k1)


def _partial_sums(particles, slot, keys, valid, cfg, size):
    """Per label on this device: records of member count and moments (see module doc).

    slot: the members' slots in ``particles``, sorted by label (valid first); keys: their
    labels; valid: which are members. The moments go straight to ``size`` records (the
    labels' runs in order, so record j is run j, its reference its first member), a block
    of ``_BLOCK`` members at a time: no array per member of the positions.
    """
    pos, dtype = particles.pos, particles.pos.dtype
    box = jnp.asarray(cfg.box_size, dtype)
    nz = cfg.particle_shape[2]
    spacing = jnp.asarray([b / n for b, n in zip(cfg.box_size, cfg.particle_shape, strict=True)])
    offset = jnp.asarray(lagrangian_offset(cfg), dtype)

    def lagrangian(ids):  # [Mpc/h]
        grid = jnp.stack([ids[:, 0], ids[:, 1] // nz, ids[:, 1] % nz], axis=1).astype(dtype)
        return grid * spacing.astype(dtype) + offset

    def velocity(vel):  # peculiar [km/s]
        return 100.0 * vel / particles.a

    run, first, _ = links.runs(keys[:, 0], keys[:, 1])
    head, n_records = compact(first & valid, size)
    ref_slot = _take(slot, head)
    ref_x, ref_v = _take(pos, ref_slot), velocity(_take(particles.vel, ref_slot))
    ref_q = lagrangian(_take(particles.ids, ref_slot))

    n = slot.shape[0]
    block = min(n, _BLOCK)
    n_blocks = -(-n // block)
    pad = lambda x, fill: jnp.pad(x, (0, n_blocks * block - n), constant_values=fill)  # noqa: E731
    slot, run, valid = pad(slot, 0), pad(run, size), pad(valid, False)

    def add(b, sums):
        moments, count = sums
        at = lambda x: lax.dynamic_slice_in_dim(x, b * block, block)  # noqa: E731
        s, r, v = at(slot), at(run), at(valid)[:, None]
        dx = jnp.where(v, _min_image(_take(pos, s) - _take(ref_x, r), box), 0)
        dv = jnp.where(v, velocity(_take(particles.vel, s)) - _take(ref_v, r), 0)
        dq = jnp.where(v, _min_image(lagrangian(_take(particles.ids, s)) - _take(ref_q, r), box), 0)
        rows = [dx, jnp.sum(dx * dx, 1, keepdims=True), dv, jnp.sum(dv * dv, 1, keepdims=True), dq]
        # runs past ``size`` are dropped here and reported through n_records
        moments = moments.at[r].add(jnp.concatenate(rows, axis=1), mode="drop")
        return moments, count.at[r].add(v[:, 0].astype(jnp.int32), mode="drop")

    zero = (jnp.zeros((size, 11), dtype), jnp.zeros(size, jnp.int32))
    moments, count = lax.fori_loop(0, n_blocks, add, jax.tree.map(Layout.varying, zero))
    floats = [ref_x, moments[:, 0:4], ref_v, moments[:, 4:8], ref_q, moments[:, 8:11]]
    return jnp.concatenate(floats, axis=1), count, _take(keys, head), head < n, n_records


def _combine(floats, count, keys, valid, box):
    """Totals over the records of each key, moved to the first record's reference."""
    k0 = jnp.where(valid, keys[:, 0], INT_MAX)
    k1 = jnp.where(valid, keys[:, 1], INT_MAX)
    order = sorting.argsort(k0, k1)
    floats, count, valid = floats[order], count[order], valid[order]
    run, first, head = links.runs(k0[order], k1[order])
    n = run.shape[0]
    c = count.astype(floats.dtype)[:, None]
    ref, s1, s2 = floats[:, 0:3], floats[:, 3:6], floats[:, 6:7]
    vref, v1, v2 = floats[:, 7:10], floats[:, 10:13], floats[:, 13:14]
    qref, q1 = floats[:, 14:17], floats[:, 17:20]
    d = _min_image(ref - ref[head], box)  # this record's reference from the head's
    dv = vref - vref[head]
    dq = _min_image(qref - qref[head], box)
    moved = [
        s1 + c * d,
        s2 + 2 * jnp.sum(d * s1, 1, keepdims=True) + c * jnp.sum(d * d, 1, keepdims=True),
        v1 + c * dv,
        v2 + 2 * jnp.sum(dv * v1, 1, keepdims=True) + c * jnp.sum(dv * dv, 1, keepdims=True),
        q1 + c * dq,
    ]
    moved = jnp.where(valid[:, None], jnp.concatenate(moved, axis=1), 0)
    sums = jax.ops.segment_sum(moved, run, n, indices_are_sorted=True)[run]
    members = jax.ops.segment_sum(count, run, n, indices_are_sorted=True)[run]
    m = members.astype(floats.dtype)[:, None]
    s1, s2, v1, v2, q1 = (
        sums[:, 0:3] / m,
        sums[:, 3:4] / m,
        sums[:, 4:7] / m,
        sums[:, 7:8] / m,
        (sums[:, 8:11] / m),
    )
    centre = wrap(ref[head] + s1, box)
    rows = [
        centre,
        vref[head] + v1,
        jnp.sqrt(jnp.maximum(v2 - jnp.sum(v1 * v1, 1, keepdims=True), 0) / 3),
        jnp.sqrt(jnp.maximum(s2 - jnp.sum(s1 * s1, 1, keepdims=True), 0)),
        wrap(qref[head] + q1, box),
    ]
    return jnp.concatenate(rows, axis=1), members, keys[order], first & valid


@functools.partial(jax.jit, static_argnames=("cfg",))
def _members(particles, labels, cfg):
    """The largest number of labelled particles on one device."""

    def local(mask, labels):
        count = jnp.sum(mask & (labels[:, 0] >= 0), dtype=jnp.int32)
        return Decomposition.of(cfg).mesh.device_max(count)

    return Decomposition.of(cfg).sharded(local, (SLOTS, SLOTS), P())(particles.mask, labels)


@functools.partial(jax.jit, static_argnames=("cfg", "size", "room"))
def _catalogue(particles, labels, cfg, size, room):
    def local(particles, labels):
        layout = Decomposition.of(cfg).mesh
        box = jnp.asarray(cfg.box_size, particles.pos.dtype)
        # the labelled particles only (``room`` holds the most a device has): the sort
        # and the sums below cost what the halos hold, not what the device holds; each
        # array is read once, in label order, through the composed indices
        slot, _ = compact(particles.mask & (labels[:, 0] >= 0), room)
        cap = labels.shape[0]
        order = _sort_by_label(_take(labels, slot), slot < cap, cfg)
        slot = slot[order]
        floats, count, keys, valid, n_records = _partial_sums(
            particles, slot, _take(labels, slot), slot < cap, cfg, size
        )
        (floats,), (count,), keys, valid, _, needs = migrate.by_key(
            [floats], [count], keys, valid, layout, size
        )
        rows, members, keys, valid = _combine(floats, count, keys, valid, box)
        need = jnp.maximum(jnp.maximum(needs["capacity"], needs["exchange"]), n_records)
        return rows, members, keys, valid, layout.device_max({"groups": need})

    specs = (SLOTS,) * 4 + (P(),)
    return Decomposition.of(cfg).sharded(local, (PARTICLES, SLOTS), specs)(particles, labels)


def record_slots(cfg, group_factor) -> int:
    """Slots per device for the group records it holds (and receives)."""
    return max(64, math.ceil(group_factor * Decomposition.of(cfg).capacity))


def halo_catalogue(
    particles, labels, cosmo, cfg, *, group_factor=0.05, so_masses=True
) -> HaloCatalogue:
    """Properties of the groups of ``labels`` (from :func:`distpm.fof`), sorted by mass.

    particles: :class:`distpm.Particles` on ``cfg``'s device grid; labels:
    (slots, 2) int32 per slot, -1 for none. Members may sit on any
    devices. group_factor: each device keeps ceil(group_factor * capacity)
    slots for the labels it holds (and receives); too few raise
    :class:`distpm.CapacityError` naming the value to set. so_masses: the
    spherical-overdensity masses (:func:`distpm.spherical_overdensity`; else NaN). The table is
    small and returned to every process as numpy arrays.
    """
    dec = Decomposition.of(cfg)
    slots = dec.slots
    if tuple(labels.shape) != (slots, 2):
        raise ValueError(f"labels has shape {tuple(labels.shape)}, expected {(slots, 2)}")
    size = record_slots(cfg, group_factor)
    held = int(_members(particles, labels, cfg))
    room = min(dec.capacity, 1 << max(6, (held - 1).bit_length()))  # few distinct shapes
    rows, members, keys, valid, needs = _catalogue(particles, labels, cfg, size, room)
    says = "halo catalogue overflow: a device needed {need} slots for group records but has {have}"
    overflow.check(needs, {"groups": Limit(size, says, "group_factor", group_factor, dec.capacity)})
    valid = to_host(valid)
    rows = to_host(rows)[valid].astype(np.float64)
    n = to_host(members)[valid].astype(np.int64)
    label = linear_ids(to_host(keys)[valid], cfg.particle_shape)
    order = np.lexsort((label, -n))
    rows, n, label = rows[order], n[order], label[order]
    so = _overdensity(particles, rows[:, 0:3], n, cosmo, cfg, so_masses)
    return HaloCatalogue(
        label=label,
        n=n,
        mass=n * particle_mass(cosmo, cfg),
        pos=rows[:, 0:3],
        vel=rows[:, 3:6],
        sigma_v=rows[:, 6],
        r_rms=rows[:, 7],
        lagrangian_pos=rows[:, 8:11],
        m200m=so["M200m"],
        r200m=so["R200m"],
        m200c=so["M200c"],
        r200c=so["R200c"],
        a=float(jax.device_get(particles.a)),
    )


def _overdensity(particles, centres, n, cosmo, cfg, wanted) -> dict:
    """:func:`distpm.spherical_overdensity` around the groups' centres (NaN if not
    ``wanted``), searched within twice the radius of n particles at 200 times the mean
    density (at most the ghosts' reach)."""
    names = ("M200m", "R200m", "M200c", "R200c")
    if not wanted or len(n) == 0:
        return {name: np.full(len(n), np.nan) for name in names}
    search = overdensity.search_radius(n, cfg)
    out = overdensity.spherical_overdensity(particles, centres, search, cosmo, cfg)
    if out["open"].any():
        warnings.warn(
            f"{int(out['open'].sum())} groups' overdensity spheres may reach past "
            f"{overdensity.reach(cfg):.4g} Mpc/h, the farthest distpm searches on this "
            "device grid: their M200 are lower bounds",
            stacklevel=3,
        )
    return out
