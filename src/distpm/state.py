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


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Particles:
    """Particles in Lagrangian-grid order (particle i started at grid index i).

    pos: (n, 3) [Mpc/h]; vel: (n, 3) [100 km/s] canonical momentum;
    acc: (n, 3) [100 km/s] force at the current positions; a: scale factor.
    """

    pos: jax.Array
    vel: jax.Array
    acc: jax.Array
    a: jax.Array

    def replace(self, **changes) -> Particles:
        return dataclasses.replace(self, **changes)


def wrap(pos, box_size):
    """Wrap positions into [0, L) per axis, robust to rounding onto L itself."""
    box = jnp.asarray(box_size, pos.dtype)
    pos = jnp.mod(pos, box)
    return jnp.where(pos >= box, pos - box, pos)


def lagrangian_grid(cfg, dtype):
    """(n, 3) [Mpc/h] unperturbed particle positions, in C order of the grid.

    Particle (i, j, l) sits at (i, j, l) * L / N_ptcl plus half a mesh cell,
    so that on a mesh as fine as the particle grid each particle lies midway
    between mesh nodes (CIC then responds smoothly to small displacements).
    """
    axes = [
        jnp.arange(n, dtype=dtype) * (box / n) + 0.5 * cell
        for n, box, cell in zip(cfg.particle_shape, cfg.box_size, cfg.cell_size, strict=True)
    ]
    grid = jnp.meshgrid(*axes, indexing="ij")
    return jnp.stack([g.reshape(-1) for g in grid], axis=-1)
