"""PM gravity: paint -> FFT -> Poisson + gradient kernels -> inverse FFTs -> readout.

The default force kernels, and why (``compensate_force = "auto"``,
``force_gradient = "auto"``; measured with
:mod:`distpm.analysis.convergence` against a converged PM run of the same
white noise, mesh 8x finer than the particle grid and 40 steps; 32^3
particles in 128 Mpc/h, 2LPT from a=0.1, 10 steps, Planck18; maximum
|P/P_ref - 1| for k <= k_Nyq/2 of the particle grid):

- Mesh as fine as the particle grid (ratio 1): paint and readout each
  smooth the force by the window W(k) (sinc^2 per axis for CIC), and at
  k_Nyq/2 that is a 30% deficit of the force. Dividing it out (1/W^2)
  recovers the power: CIC + 4th-order finite differences 2.4%, TSC +
  spectral gradient 1.2%; uncompensated they are 31% and 38% low at k_Nyq/2.
- Mesh twice as fine or more (ratio >= 2): the mesh now resolves the
  particle lattice itself (its fundamental 2 pi / spacing sits at or below
  the mesh's Nyquist frequency), where the window is small and aliases
  are as large as the signal. 1/W^2 (up to 6x per axis at the mesh's
  Nyquist frequency) amplifies that discreteness, and the run gains
  spurious small-scale power: +10% (CIC + fd), +47% (CIC + ik) at
  k_Nyq/2 at ratio 2, and -9% at ratio 3. Without compensation: 0.3%
  (CIC + fd, ratio 2), 1.2% (ratio 3), 2.1% (ratio 4), 1.3% (TSC + ik,
  ratio 2). So "auto" compensates when the mesh is less than twice as
  fine as the particle grid (at ratio 1.5: 3.0% compensated, 5.9% not).
- The gradient kernel goes with the assignment kernel: CIC + fd and TSC +
  ik smooth the force near the mesh's Nyquist frequency about equally;
  TSC + fd smooths it twice (-5% at k_Nyq/2, ratio 2; +4% at ratio 1)
  and CIC + ik too little (+8%, ratio 2).

The accuracy table (64^3 particles, 5 to 40 steps, every kernel) is in
``benchmarks/README.md`` (``benchmarks/accuracy.py``).
"""

from __future__ import annotations

import functools
import math

import jax.numpy as jnp
from jax import lax

from distpm import kernels
from distpm.painting import paint, readout


def mass_per_particle(cfg) -> float:
    """Particle mass in units of the mean mass per mesh cell."""
    return math.prod(cfg.mesh_shape) / cfg.n_particles


def paint_density(pos, mask, layout, cfg):
    """1 + delta on the local mesh block from the positions [Mpc/h] of valid slots."""
    mass = mass_per_particle(cfg)
    return paint(pos, mass, layout, cfg.cell_size, cfg.paint_order, mask=mask)


def force(pos, mask, cosmo, layout, cfg, split=True, kick=None):
    """PM force F = -grad(phi), lap(phi) = 1.5 Omega_m delta, at the particles.

    pos: (n, 3) [Mpc/h] of the particles this device owns; mask: (n,) bool
    of valid slots. Returns (n, 3) in [100 km/s] (H0 * Mpc/h), zero on
    invalid slots: with canonical momentum p, dp/da = F / (a^2 E(a)). The
    k = 0 mode carries no force. If ``cfg.force_compensated`` the density
    is divided by the mass-assignment window twice (once for paint, once
    for readout); the gradient kernel is ``cfg.gradient_kind`` (see the
    module docstring for the defaults).

    kick: None or (vel, k): return vel + k F instead of F, each component
    added into ``vel``'s column as it is read out (no (n, 3) force array;
    XLA updates ``vel`` in place when nothing else reads it).

    split: the three components go through the inverse FFT and the readout
    one at a time (a ``fori_loop``), so that one real field exists at a
    time, not three, as fast. Its derivative is slower than the
    joint one's (``benchmarks/step_versions.py``), so the reverse-time
    adjoint, which takes the force's VJP itself, asks for ``split=False``.
    """
    dtype = pos.dtype
    delta_k = layout.rfft3d(paint_density(pos, mask, layout, cfg))
    kvec = layout.wavenumbers(cfg.box_size, dtype)
    potential = kernels.inverse_laplacian(kvec)
    if cfg.force_compensated:
        window = kernels.mass_assignment_window(kvec, cfg.cell_size, cfg.paint_order)
        potential = potential / window**2
    # F_k = -i D phi_k = -i D * 1.5 Omega_m * (-1/k^2) delta_k
    phi_k = delta_k * (1.5 * cosmo.Omega_m * potential).astype(dtype)
    grads = kernels.gradient_kernel(kvec, cfg.cell_size, cfg.gradient_kind)
    components = [lambda d=d: -1j * d * phi_k for d in grads]
    read = functools.partial(
        readout, pos=pos, layout=layout, cell_size=cfg.cell_size, order=cfg.paint_order, mask=mask
    )
    n = pos.shape[0]
    if kick is None:
        base, k = layout.varying(jnp.zeros((n, 3), dtype)), 1.0
    else:
        base, k = kick
        if base.shape != (n, 3) or base.dtype != dtype:
            raise ValueError(
                f"kick's momenta must be a {dtype}[{n}, 3] array like the force, "
                f"got {base.dtype}{list(base.shape)}"
            )
    if not split:  # one inverse FFT (one set of transposes) of the three components
        field = layout.irfft3d(jnp.stack([c() for c in components], axis=-1))
        values = read(field.astype(dtype))
        return values if kick is None else base + k * values

    def component(i, out):
        """Component i through its own inverse FFT and readout, added into column i."""
        field = layout.irfft3d(lax.switch(i, components)).astype(dtype)
        return read(field, add_to=(out, i, k))

    return lax.fori_loop(0, 3, component, base)
