"""Particle state: a pytree of arrays.

Units and conventions:
- ``pos`` [Mpc/h]: comoving positions, wrapped into the periodic box [0, L).
- ``vel`` [100 km/s]: canonical momentum p = a^2 dx/dt in units of H0 * Mpc/h.
  The peculiar velocity is v = p / a (so v [km/s] = 100 * vel / a).

The PM force is not part of the state: consecutive kicks are merged (see
:mod:`distpm.nbody.schedule`), so between the steps of a run (and only there) the
momenta are kicked ahead to the next step's midpoint.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from distpm.ops.buffers import zeros_after
from distpm.parallel.decomposition import SLOTS
from distpm.parallel.runtime import to_host


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Particles:
    """Particles in fixed-size per-device buffers.

    As global arrays, every field but ``a`` has a leading axis of
    ``n_devices * capacity`` slots, split over the devices in blocks
    (sharding ``P(("x", "y"))``); each device holds the particles inside its
    mesh block, in any of its slots (``mask``). ``pos[mask]`` are exactly the N
    particles, in no particular order; ``ids`` give each particle's place
    (i, j, l) on the Lagrangian grid, to match particles between runs (see
    :meth:`by_id`).

    pos: (m, 3) [Mpc/h]; vel: (m, 3) [100 km/s] canonical momentum at
    ``a`` (kicked ahead half a step between the steps of
    :func:`distpm.simulation.step`); ids: (m, 2)
    int32, the two words (i, j * Nz + l) of the Lagrangian index
    (i * Ny + j) * Nz + l (:func:`linear_ids`), which exceeds int32 past
    2^31 particles; (i, j * Nz + l) pairs sort in the same order as it.
    mask: (m,) bool, True on valid slots; a: scale factor. Invalid slots
    hold zeros.
    """

    pos: jax.Array
    vel: jax.Array
    ids: jax.Array
    mask: jax.Array
    a: jax.Array

    def replace(self, **changes) -> Particles:
        return dataclasses.replace(self, **changes)

    @property
    def count(self) -> int:
        """Number of valid particles (all devices), a Python int (no int32 limit)."""
        n_blocks = len(self.mask.sharding.device_set) if hasattr(self.mask, "sharding") else 1
        per_block = jnp.sum(self.mask.reshape(n_blocks, -1), axis=1, dtype=jnp.int32)
        return int(np.sum(to_host(per_block), dtype=np.int64))

    def by_id(self, field: str = "pos"):
        """The valid particles' ``field`` (n, ...) in Lagrangian order (sorted by id).

        Gathers the whole array to every process: meant for analysis and tests,
        not for the hot path.
        """
        mask = to_host(self.mask)
        values = to_host(getattr(self, field))[mask]
        ids = to_host(self.ids)[mask]
        return values[np.lexsort((ids[:, 1], ids[:, 0]))]


# how Particles are split over the devices: one block of slots per device, one scale factor
PARTICLES = Particles(pos=SLOTS, vel=SLOTS, ids=SLOTS, mask=SLOTS, a=P())


def linear_ids(ids, particle_shape) -> np.ndarray:
    """Lagrangian indices (i * Ny + j) * Nz + l, int64 (host), of (..., 2) id words; -1 where
    the words are -1 (an empty slot, a neighbour or group not found).

    The one index form of distpm's results: ``fof_points`` / ``knn_points`` give row
    indices in it, and for a run's particles it indexes ``particles.by_id(...)``.
    """
    ids = np.asarray(ids)
    _, ny, nz = particle_shape
    index = ids[..., 0].astype(np.int64) * (ny * nz) + ids[..., 1].astype(np.int64)
    return np.where(ids[..., 0] >= 0, index, -1)


def id_words(i, j, k, particle_shape):
    """(..., 2) int32 id words (i, j * Nz + k) of Lagrangian grid indices (i, j, k) (int32).

    Needs Ny * Nz < 2^31 (checked by :class:`distpm.SimConfig`).
    """
    nz = particle_shape[2]
    return jnp.stack([i, j * nz + k], axis=-1)


def wrap(pos, box_size):
    """Wrap positions into [0, L) per axis, robust to rounding onto L itself."""
    box = jnp.asarray(box_size, pos.dtype)
    pos = jnp.mod(pos, box)
    return jnp.where(pos >= box, pos - box, pos)


def lagrangian_offset(cfg) -> np.ndarray:
    """[Mpc/h] (3,) offset of the particle lattice from the origin: half a mesh cell."""
    return 0.5 * np.asarray(cfg.cell_size)


def lagrangian_block(cfg, layout, dtype, after=None):
    """Unperturbed positions (n, 3) [Mpc/h] and ids (n, 2) of the local particle-grid block.

    ``layout`` splits the particle grid. Particle (i, j, l) sits at
    (i, j, l) * L / N_ptcl plus half a mesh cell, so that on a mesh as fine
    as the particle grid each particle lies midway between mesh nodes (CIC
    then responds smoothly to small displacements). Local C order.
    after: None, or an array the positions and ids are made after (see
    :func:`distpm.ops.buffers.zeros_after`; the same values).
    """
    index = [_lattice_index(layout, axis, after) for axis in range(3)]
    ids = id_words(*index, cfg.particle_shape)
    pos = [_lattice_position(cfg, i, axis, dtype) for axis, i in enumerate(index)]
    return jnp.stack(pos, axis=-1), ids


def lagrangian_column(cfg, layout, dtype, axis: int, after=None):
    """Column ``axis`` of :func:`lagrangian_block`'s positions (n,), made on its own."""
    return _lattice_position(cfg, _lattice_index(layout, axis, after), axis, dtype)


def _lattice_index(layout, axis: int, after=None):
    """Global grid index along ``axis`` of the local block's points (n,), local C order."""
    zero = zeros_after((), jnp.int32, after)
    index = jax.lax.broadcasted_iota(jnp.int32, layout.local_shape, axis)
    # the zero first: iota + origin made without it would be hoisted out of a loop and kept
    return (index.reshape(-1) + zero) + layout.local_origin[axis]


def _lattice_position(cfg, index, axis: int, dtype):
    spacing = cfg.box_size[axis] / cfg.particle_shape[axis]
    offset = float(lagrangian_offset(cfg)[axis])
    return index.astype(dtype) * spacing + offset  # Python floats keep the dtype
