"""Redshift space: positions seen through their line-of-sight velocities, and Kaiser's
linear prediction of the power spectrum's multipoles there.

Plane-parallel, along one axis of the box (the observer far away): a
particle at x with peculiar velocity v is seen at s = x + v_los / (a H(a)).
With distpm's canonical momenta p [100 km/s] (v = p / a, H = 100 E(a)
km/s per Mpc/h), s = x + p_los / (a^2 E(a)) [Mpc/h].

Radial, seen from an observer in the box (:func:`radial_redshift_space`): each
particle moves along its own line of sight r = x - observer (the nearest
periodic image), s = x + r_hat (r_hat . p) / (a^2 E(a)), as a lightcone's
particles are seen.

Kaiser (1987): in linear theory delta_s(k) = (1 + f mu^2) delta(k), so
P_s(k, mu) = (1 + f mu^2)^2 P(k) and its multipoles are
P0 = (1 + 2f/3 + f^2/5) P, P2 = (4f/3 + 4f^2/7) P, P4 = 8f^2/35 P, with f
the linear growth rate.
"""

from __future__ import annotations

import jax.numpy as jnp

from distpm import background
from distpm.state import Particles, wrap

AXES = {"x": 0, "y": 1, "z": 2}
KAISER = {0: (1.0, 2 / 3, 1 / 5), 2: (0.0, 4 / 3, 4 / 7), 4: (0.0, 0.0, 8 / 35)}


def redshift_space(particles: Particles, cosmo, cfg, *, axis: int = 2) -> Particles:
    """The particles with their positions moved to redshift space along ``axis`` (0, 1, 2)
    and wrapped into the box. Their momenta must be at their positions' time
    (synchronised: the states of :func:`distpm.simulate_snapshots`, a run's outputs).
    Differentiable in the positions, momenta and cosmology."""
    if axis not in (0, 1, 2):
        raise ValueError(f"the line of sight is axis 0, 1 or 2, got {axis!r}")
    a = particles.a
    shift = particles.vel[:, axis] / (a * a * background.E(a, cosmo))
    pos = particles.pos.at[:, axis].add(jnp.where(particles.mask, shift, 0))
    return particles.replace(pos=wrap(pos, cfg.box_size))


def radial_redshift_space(particles: Particles, cosmo, cfg, observer) -> Particles:
    """The particles with their positions moved to redshift space along their lines of sight
    from ``observer`` ([Mpc/h], 3 coordinates in the box; each particle seen in its nearest
    periodic image), and wrapped into the box. Momenta synchronised with the positions, as
    for :func:`redshift_space`; a particle at the observer does not move. Differentiable in
    the positions, momenta and cosmology."""
    box = jnp.asarray(cfg.box_size, particles.pos.dtype)
    observer = jnp.asarray(observer, particles.pos.dtype)
    if observer.shape != (3,):
        raise ValueError(f"observer must be 3 coordinates [Mpc/h], got {observer.shape}")
    r = particles.pos - observer
    r = r - box * jnp.round(r / box)  # the nearest image
    dist2 = jnp.sum(r * r, axis=-1, keepdims=True)
    safe = jnp.where(dist2 > 0, dist2, 1.0)
    a = particles.a
    u_los = jnp.sum(r * particles.vel, axis=-1, keepdims=True) / (a * a * background.E(a, cosmo))
    shift = jnp.where((dist2 > 0) & particles.mask[:, None], r * u_los / safe, 0)
    return particles.replace(pos=wrap(particles.pos + shift, cfg.box_size))


def kaiser(p, f, ell: int):
    """Kaiser's multipole ``ell`` (0, 2, 4) of a real-space power spectrum ``p`` with
    growth rate ``f``: (c0 + c1 f + c2 f^2) p."""
    c0, c1, c2 = KAISER[ell]
    return (c0 + c1 * f + c2 * f * f) * p
