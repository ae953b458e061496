"""PM gravity: paint -> FFT -> Poisson + gradient kernels -> inverse FFTs -> readout."""

from __future__ import annotations

import math

import jax.numpy as jnp

from distpm import kernels
from distpm.painting import paint, readout


def mass_per_particle(cfg) -> float:
    """Particle mass in units of the mean mass per mesh cell."""
    return math.prod(cfg.mesh_shape) / cfg.n_particles


def paint_density(pos, mask, layout, cfg):
    """1 + delta on the local mesh block from the positions [Mpc/h] of valid slots."""
    mass = mass_per_particle(cfg)
    return paint(pos, mass, layout, cfg.cell_size, cfg.paint_order, mask=mask)


def force(pos, mask, cosmo, layout, cfg):
    """PM force F = -grad(phi), lap(phi) = 1.5 Omega_m delta, at the particles.

    pos: (n, 3) [Mpc/h] of the particles this device owns; mask: (n,) bool
    of valid slots. Returns (n, 3) in [100 km/s] (H0 * Mpc/h), zero on
    invalid slots: with canonical momentum p, dp/da = F / (a^2 E(a)). The
    k = 0 mode carries no force. With ``cfg.compensate_force`` the density
    is divided by the mass-assignment window twice (once for paint, once
    for readout).
    """
    dtype = pos.dtype
    delta_k = layout.rfft3d(paint_density(pos, mask, layout, cfg))
    kvec = layout.wavenumbers(cfg.box_size, dtype)
    potential = kernels.inverse_laplacian(kvec)
    if cfg.compensate_force:
        window = kernels.mass_assignment_window(kvec, cfg.cell_size, cfg.paint_order)
        potential = potential / window**2
    # F_k = -i D phi_k = -i D * 1.5 Omega_m * (-1/k^2) delta_k
    phi_k = delta_k * (1.5 * cosmo.Omega_m * potential).astype(dtype)
    grads = kernels.gradient_kernel(kvec, cfg.cell_size, cfg.force_gradient)
    # the three components go through one inverse FFT (one set of transposes)
    field = layout.irfft3d(jnp.stack([-1j * d * phi_k for d in grads], axis=-1)).astype(dtype)
    return readout(field, pos, layout, cfg.cell_size, cfg.paint_order, mask=mask)
