"""Particle state: a pytree of arrays.

Units and conventions:
- ``pos`` [Mpc/h]: comoving positions, wrapped into the periodic box [0, L).
- ``vel`` [100 km/s]: canonical momentum p = a^2 dx/dt in units of H0 * Mpc/h.
  The peculiar velocity is v = p / a (so v [km/s] = 100 * vel / a).
- ``acc`` [100 km/s]: the PM force F = -grad(phi) with lap(phi) = 1.5 Omega_m delta,
  evaluated at the current positions, so that dp/da = F / (a^2 E(a)).
  It is carried between kick-drift-kick steps to avoid recomputing it.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from distpm.parallel.runtime import to_host


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Particles:
    """Particles in fixed-size per-device buffers.

    As global arrays, every field but ``a`` has a leading axis of
    ``n_devices * capacity`` slots, split over the devices in blocks
    (sharding ``P(("x", "y"))``); each device holds the particles inside its
    mesh block, valid slots first. ``pos[mask]`` are exactly the N
    particles, in no particular order; ``ids`` give each particle's
    Lagrangian grid index (i * Ny + j) * Nz + l, to match particles between
    runs (see :meth:`by_id`).

    pos: (m, 3) [Mpc/h]; vel: (m, 3) [100 km/s] canonical momentum;
    acc: (m, 3) [100 km/s] force at the current positions; ids: (m,) int32;
    mask: (m,) bool, True on valid slots; a: scale factor. Invalid slots
    hold zeros.
    """

    pos: jax.Array
    vel: jax.Array
    acc: jax.Array
    ids: jax.Array
    mask: jax.Array
    a: jax.Array

    def replace(self, **changes) -> Particles:
        return dataclasses.replace(self, **changes)

    @property
    def count(self):
        """Number of valid particles (all devices)."""
        return jnp.sum(self.mask)

    def by_id(self, field: str = "pos"):
        """The valid particles' ``field`` (n, ...) in Lagrangian order (sorted by id).

        Gathers the whole array to every process: meant for analysis and tests,
        not for the hot path.
        """
        mask = to_host(self.mask)
        values = to_host(getattr(self, field))[mask]
        return values[np.argsort(to_host(self.ids)[mask])]


def wrap(pos, box_size):
    """Wrap positions into [0, L) per axis, robust to rounding onto L itself."""
    box = jnp.asarray(box_size, pos.dtype)
    pos = jnp.mod(pos, box)
    return jnp.where(pos >= box, pos - box, pos)


def lagrangian_block(cfg, layout, dtype):
    """Unperturbed positions (n, 3) [Mpc/h] and ids (n,) of the local particle-grid block.

    ``layout`` splits the particle grid. Particle (i, j, l) sits at
    (i, j, l) * L / N_ptcl plus half a mesh cell, so that on a mesh as fine
    as the particle grid each particle lies midway between mesh nodes (CIC
    then responds smoothly to small displacements). Local C order.
    """
    index = [
        jnp.arange(n, dtype=jnp.int32) + origin
        for n, origin in zip(layout.local_shape, layout.local_origin, strict=True)
    ]
    index = jnp.meshgrid(*index, indexing="ij")
    _, ny, nz = cfg.particle_shape
    ids = ((index[0] * ny + index[1]) * nz + index[2]).reshape(-1)
    spacing = [b / n for b, n in zip(cfg.box_size, cfg.particle_shape, strict=True)]
    pos = [
        i.reshape(-1).astype(dtype) * d + 0.5 * c
        for i, d, c in zip(index, spacing, cfg.cell_size, strict=True)
    ]
    return jnp.stack(pos, axis=-1), ids
