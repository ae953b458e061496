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
``benchmarks/accuracy.md`` (``benchmarks/accuracy.py``).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from distpm import kernels
from distpm.ops.buffers import zeros_after
from distpm.painting import paint, readout


def mass_per_particle(cfg) -> float:
    """Particle mass in units of the mean mass per mesh cell."""
    return math.prod(cfg.mesh_shape) / cfg.n_particles


def paint_density(pos, mask, layout, cfg):
    """1 + delta on the local mesh block from the positions [Mpc/h] of valid slots."""
    mass = mass_per_particle(cfg)
    return paint(pos, mass, layout, cfg.cell_size, cfg.paint_order, mask=mask)


def _components(delta_k, cosmo, layout, cfg):
    """The force's Fourier components F_k = -i D phi_k, as a function of the component's
    index (each made where it is used), from the density delta_k; lap(phi) = 1.5 Omega_m
    delta."""
    dtype = delta_k.real.dtype
    # wavenumbers made from the modes: the kernels are made where they are used, in each
    # step, not hoisted out of a run's loop and kept through a gradient's adjoint (nor
    # folded into constants on one device: every grid makes them the same way)
    zero = zeros_after((), dtype, delta_k.real)
    kvec = [k + zero for k in layout.wavenumbers(cfg.box_size, dtype)]
    potential = kernels.inverse_laplacian(kvec)
    if cfg.force_compensated:
        window = kernels.mass_assignment_window(kvec, cfg.cell_size, cfg.paint_order)
        potential = potential / window**2
    # F_k = -i D phi_k = -i D * 1.5 Omega_m * (-1/k^2) delta_k
    phi_k = delta_k * (1.5 * cosmo.Omega_m * potential).astype(dtype)
    grads = kernels.gradient_kernel(kvec, cfg.cell_size, cfg.gradient_kind)

    def component(i):  # a select, not lax.switch: a GPU reads a switch's index on the host
        d = jnp.where(i == 0, grads[0], jnp.where(i == 1, grads[1], grads[2]))
        return -1j * d * phi_k

    return component


def _density_k(pos, mask, layout, cfg):
    return layout.rfft3d(paint_density(pos, mask, layout, cfg))


def _read(i, delta_k, pos, mask, cosmo, layout, cfg, components=None, add_to=None):
    """Force component i at the particles: its inverse FFT and readout (``add_to``: see
    :func:`~distpm.painting.readout`). components: :func:`_components`, if made already."""
    components = components or _components(delta_k, cosmo, layout, cfg)
    field = layout.irfft3d(components(i)).astype(pos.dtype)
    return readout(field, pos, layout, cfg.cell_size, cfg.paint_order, mask, add_to)


def _kicked(delta_k, pos, mask, cosmo, layout, cfg, base, k):
    """``base`` (n, 3) plus k times the force of the density modes ``delta_k``, one
    component at a time (a ``fori_loop``): one real field exists at a time, not three."""
    components = _components(delta_k, cosmo, layout, cfg)

    def component(i, out):
        return _read(i, delta_k, pos, mask, cosmo, layout, cfg, components, (out, i, k))

    return lax.fori_loop(0, 3, component, base)


def force(pos, mask, cosmo, layout, cfg, kick=None):
    """PM force F = -grad(phi), lap(phi) = 1.5 Omega_m delta, at the particles.

    pos: (n, 3) [Mpc/h] of the particles this device owns; mask: (n,) bool
    of valid slots. Returns (n, 3) in [100 km/s] (H0 * Mpc/h), zero on
    invalid slots: with canonical momentum p, dp/da = F / (a^2 E(a)). The
    k = 0 mode carries no force. If ``cfg.force_compensated`` the density
    is divided by the mass-assignment window twice (once for paint, once
    for readout); the gradient kernel is ``cfg.gradient_kind`` (see the
    module docstring for the defaults). The three components go through the
    inverse FFT and the readout one at a time. JAX's derivative of it keeps the three
    components' fields; :func:`force_vjp` makes them again one at a time.

    kick: None or (vel, k): return vel + k F instead of F, each component
    added into ``vel``'s column as it is read out (no (n, 3) force array;
    XLA updates ``vel`` in place when nothing else reads it).
    """
    n, dtype = pos.shape[0], pos.dtype
    if kick is None:
        base, k = layout.varying(zeros_after((n, 3), dtype, pos)), 1.0
    else:
        base, k = kick
        if base.shape != (n, 3) or base.dtype != dtype:
            raise ValueError(
                f"kick's momenta must be a {dtype}[{n}, 3] array like the force, "
                f"got {base.dtype}{list(base.shape)}"
            )
    return _kicked(_density_k(pos, mask, layout, cfg), pos, mask, cosmo, layout, cfg, base, k)


def force_vjp(pos, mask, cosmo, g, layout, cfg, scale=1.0, kick=None, g_pos=None):
    """The force :func:`force` at ``pos`` and its VJP for the cotangent ``scale * g``
    (g: (n, 3), scale: a scalar), making each component's field once, one at a time.

    Returns (F, cotangent of pos, of cosmo, sum(g F)). kick: None or (vel, k):
    vel + k F in place of F, as :func:`force` (a column at a time: no (n, 3) force
    array). Each column of ``scale * g`` is made where it is used. g_pos: None, or the
    positions' cotangent so far, to which the force's is added (in place: no second
    (n, 3) array of it).

    The density's Fourier modes are made once (one complex field); each
    component's inverse FFT and readout is made and differentiated in turn
    (a ``fori_loop``), which gives that component of F and adds to the
    cotangents of the modes and positions; the paint's VJP then takes that of
    the modes. ``jax.vjp`` of :func:`force` keeps the three components'
    fields at once, for the whole backward pass.
    """
    dtype = pos.dtype
    delta_k, density_vjp = jax.vjp(lambda p: _density_k(p, mask, layout, cfg), pos)
    column = lambda x, i: lax.dynamic_index_in_dim(x, i, axis=1, keepdims=False)  # noqa: E731

    def component(i, carry):
        out, dot, sums = carry
        read = lambda d, p, c: _read(i, d, p, mask, c, layout, cfg)  # noqa: E731
        value, read_vjp = jax.vjp(read, delta_k, pos, cosmo)
        column_i = value if kick is None else column(out, i) + k * value
        out = lax.dynamic_update_slice(out, column_i[:, None], (0, i))
        g_i = column(g, i)
        sums = jax.tree.map(jnp.add, sums, read_vjp(scale * g_i))
        return out, dot + jnp.sum(g_i * value), sums

    g_delta_k = layout.varying(zeros_after(delta_k.shape, delta_k.dtype, g))  # once g is
    if g_pos is None:
        g_pos = layout.varying(zeros_after(pos.shape, dtype, g))
    if kick is None:
        out, k = layout.varying(zeros_after(pos.shape, dtype, g)), None
    else:
        out, k = kick
    sums = (g_delta_k, g_pos, jax.tree.map(jnp.zeros_like, cosmo))
    dot = layout.varying(jnp.zeros((), dtype))
    out, dot, (g_delta_k, g_pos, g_cosmo) = lax.fori_loop(0, 3, component, (out, dot, sums))
    return out, g_pos + density_vjp(g_delta_k)[0], g_cosmo, dot
