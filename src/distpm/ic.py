"""Initial conditions: white noise, linear modes, 1LPT and 2LPT.

Conventions (Scoccimarro 1998): x = q + D1 s1 + D2 s2 with
s1 = -grad(phi1), lap(phi1) = delta_L (the linear density at a=1), and
s2 = grad(phi2), lap(phi2) = sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2), D2 < 0
(D2 ~ -3/7 D1^2). The canonical momentum is p = a^2 E(a) (f1 D1 s1 + f2 D2 s2).

All fields here live on the particle grid, split over the devices like the
mesh (``layout`` below is the particle grid's :class:`distpm.parallel.Layout`);
the functions taking a layout run on the local block, inside ``shard_map``.
"""

from __future__ import annotations

import functools
import math
import numbers

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from distpm import background, kernels
from distpm.linear_power import resolved
from distpm.parallel.devices import device_mesh
from distpm.state import lagrangian_block, wrap


def white_noise(seed, cfg):
    """N(0, 1) real-space noise on the particle grid, shape ``cfg.particle_shape``.

    seed: an integer >= 0, a JAX PRNG key (``jax.random.key(i)``, or the legacy
        ``jax.random.PRNGKey(i)``; the same noise for the same seed), or None for
        ``cfg.seed`` (what ``distpm run`` draws with).

    Drawn with jax's partitionable threefry generator (the flag is switched on
    for this call), so every value depends on its global index only: the noise
    is bit for bit the same on any device grid and in any number of processes.
    Returned split over ``cfg.device_grid`` (sharding ``P("x", "y")``).
    """
    cfg.check_runnable()
    sharding = NamedSharding(device_mesh(cfg.device_grid), P("x", "y"))
    key = _key(cfg.seed if seed is None else seed)
    with jax.threefry_partitionable(True):
        return _normal(key, cfg.particle_shape, cfg.float_dtype, sharding)


def _key(seed):
    """A typed PRNG key from an integer seed or a key (typed, or legacy uint32 data)."""
    dtype = getattr(seed, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return seed
    if dtype == jnp.uint32 and getattr(seed, "shape", None) == (2,):
        return jax.random.wrap_key_data(seed)
    if dtype is not None and jnp.issubdtype(dtype, jnp.integer) and jnp.ndim(seed) == 0:
        if isinstance(seed, jax.core.Tracer):  # a seed traced by jit: unchecked
            return jax.random.key(seed)
        seed = int(seed)
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral) or seed < 0:
        raise TypeError(f"seed must be an integer >= 0, a PRNG key or None, got {seed!r}")
    return jax.random.key(seed)


@functools.partial(jax.jit, static_argnums=(1, 2, 3))
def _normal(key, shape, dtype, sharding):
    return jax.lax.with_sharding_constraint(jax.random.normal(key, shape, dtype), sharding)


def check_noise(noise, cfg):
    """Raise a clear error if ``noise`` does not fit ``cfg``, or if it holds NaN or inf
    (checked where its values can be read: not inside ``jax.jit`` or ``jax.grad``)."""
    shape = tuple(getattr(noise, "shape", ()))
    if shape != cfg.particle_shape:
        raise ValueError(
            f"noise has shape {shape}, but particle_shape is {cfg.particle_shape}; "
            "make it with distpm.white_noise(seed, cfg)"
        )
    if isinstance(noise, jax.core.Tracer):
        return
    with jax.ensure_compile_time_eval():  # a concrete array, also when closed over in a jit
        finite = bool(jnp.all(jnp.isfinite(noise)))
    if not finite:
        raise ValueError("noise holds NaN or inf values")


def linear_modes(noise, cosmo, layout, cfg):
    """Linear density modes at a=1 on the local block of the particle grid (k-space layout).

    delta_k = FFT(noise) * sqrt(P(k) N / V), so that V <|delta_k / N|^2> = P(k)
    with N the number of grid points and V the box volume. With
    ``cfg.fixed_amplitude`` the noise amplitude is replaced by its mean,
    |FFT(noise)|^2 = N, keeping only the phases. The k = 0 mode is zero.
    """
    noise_k = layout.rfft3d(noise)
    n_cells = math.prod(cfg.particle_shape)
    if cfg.fixed_amplitude:
        amplitude = jnp.abs(noise_k)
        nonzero = amplitude > 0
        noise_k = noise_k * jnp.where(
            nonzero, math.sqrt(n_cells) / jnp.where(nonzero, amplitude, 1.0), 0.0
        )
    k = jnp.sqrt(kernels.k_squared(layout.wavenumbers(cfg.box_size, noise.dtype)))
    power = resolved(cfg.linear_power)(k, cosmo)
    scale = jnp.sqrt(power * (n_cells / math.prod(cfg.box_size))).astype(noise.dtype)
    return noise_k * scale


def _potentials(delta_k, layout, cfg):
    """(gradient kernels, phi1_k, phi2_k) on the local k-space block; phi2_k is None for
    ``cfg.lpt_order == 1``. lap(phi1) = delta, lap(phi2) = sum_{i<j} (phi1_ii phi1_jj -
    phi1_ij^2); the Hessian terms are added one at a time, so at most four real fields
    of them exist at once."""
    kvec = layout.wavenumbers(cfg.box_size, delta_k.real.dtype)
    cell = [b / n for b, n in zip(cfg.box_size, cfg.particle_shape, strict=True)]
    deriv = kernels.gradient_kernel(kvec, cell, "ik")
    inv_lap = kernels.inverse_laplacian(kvec)  # -1/k^2
    phi1_k = inv_lap * delta_k
    if cfg.lpt_order == 1:
        return deriv, phi1_k, None

    def hessian(i, j):
        return layout.irfft3d(-deriv[i] * deriv[j] * phi1_k)

    diagonal = [hessian(i, i) for i in range(3)]
    source = diagonal[0] * diagonal[1] + diagonal[0] * diagonal[2] + diagonal[1] * diagonal[2]
    for i, j in ((0, 1), (0, 2), (1, 2)):
        source = source - hessian(i, j) ** 2
    return deriv, phi1_k, inv_lap * layout.rfft3d(source)


def _gradient(phi_k, d, layout):
    """One component of grad(phi) [Mpc/h] on the local block, flattened (local C order)."""
    return layout.irfft3d(1j * d * phi_k).reshape(-1)


def _per_axis(delta_k, layout, cfg):
    """Per axis, (s1, s2) components [Mpc/h] (n,) on the local block of the particle grid;
    s2 is None for ``cfg.lpt_order == 1``. One axis at a time: no (n, 3) field is made."""
    deriv, phi1_k, phi2_k = _potentials(delta_k, layout, cfg)
    for d in deriv:
        s1 = -_gradient(phi1_k, d, layout)
        yield s1, None if phi2_k is None else _gradient(phi2_k, d, layout)


def lpt_displacements(delta_k, layout, cfg):
    """s1 and s2 [Mpc/h], each (n, 3), on the local block of the particle grid (local C order).

    s1 = -grad(phi1), s2 = grad(phi2) (see :func:`_potentials`). Derivatives are spectral
    (i k), with the Nyquist frequency zeroed; s2 is None for ``cfg.lpt_order == 1``.
    """
    s1, s2 = zip(*_per_axis(delta_k, layout, cfg), strict=True)
    return jnp.stack(s1, axis=-1), None if s2[0] is None else jnp.stack(s2, axis=-1)


def lpt(delta_k, cosmo, layout, cfg, a=None):
    """Positions and momenta at scale factor ``a`` (default ``cfg.a_start``) from linear modes.

    delta_k: linear modes at a=1 from :func:`linear_modes` (local block).
    Returns (pos (n, 3) [Mpc/h] wrapped into the box, vel (n, 3) [100 km/s],
    ids (n,)) of the local block of the particle grid, in local C order.
    """
    a = cfg.a_start if a is None else a
    dtype = delta_k.real.dtype
    table = background.growth_table(cosmo)
    d1, f1, d2, f2 = background.growth(a, table)
    e = background.E(a, cosmo)
    disp, mom = [], []
    for s1, s2 in _per_axis(delta_k, layout, cfg):
        disp.append(d1 * s1 if s2 is None else d1 * s1 + d2 * s2)
        mom.append(f1 * d1 * s1 if s2 is None else f1 * d1 * s1 + f2 * d2 * s2)
    disp, mom = jnp.stack(disp, axis=-1), jnp.stack(mom, axis=-1)
    q, ids = lagrangian_block(cfg, layout, dtype)
    pos = wrap(q + disp.astype(dtype), cfg.box_size)
    return pos, (a**2 * e * mom).astype(dtype), ids
