"""Initial conditions: white noise, linear modes, 1LPT, 2LPT and 3LPT.

Conventions (Scoccimarro 1998): x = q + D1 s1 + D2 s2 with
s1 = -grad(phi1), lap(phi1) = delta_L (the linear density at a=1), and
s2 = grad(phi2), lap(phi2) = sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2), D2 < 0
(D2 ~ -3/7 D1^2). The canonical momentum is p = a^2 E(a) (f1 D1 s1 + f2 D2 s2).

3LPT adds D3a s3a + D3b s3b + D3c s3c (growth factors in :mod:`distpm.background`).
With the Hessians H1 = phi1_ij and H2 = phi2_ij:
s3a = -grad(phi3a), lap(phi3a) = det H1;
s3b = -grad(phi3b), lap(phi3b) = tr H1 tr H2 - tr(H1 H2);
s3c is transverse (div s3c = 0) with curl set by d_j s3c_i - d_i s3c_j = (H2 H1 - H1 H2)_ij,
so lap(s3c_i) = sum_j d_j (H2 H1 - H1 H2)_ij.
These follow from the Lagrangian equations of motion order by order; the test
checks the displacement against those equations, not against these formulas.

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
from jax import lax

from distpm import background, kernels
from distpm.linear_power import resolved
from distpm.ops.buffers import zeros_after
from distpm.parallel.decomposition import Decomposition
from distpm.state import lagrangian_block, lagrangian_column, wrap


def white_noise(seed, cfg):
    """N(0, 1) real-space noise on the particle grid, shape ``cfg.particle_shape``.

    seed: an integer >= 0, a JAX PRNG key (``jax.random.key(i)``, or the legacy
        ``jax.random.PRNGKey(i)``; the same noise for the same seed), or None for
        ``cfg.seed`` (what ``distpm run`` draws with).

    Drawn with jax's partitionable threefry generator (the flag is switched on
    for this call), so every value depends on its global index only: the noise
    is bit for bit the same on any device grid and in any number of processes.
    Returned split over the config's device grid (sharding ``P("x", "y")``).
    """
    cfg.check_runnable()
    sharding = Decomposition.of(cfg).sharding()
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


def _wavenumbers(layout, cfg, dtype, after=None):
    """[h/Mpc] the local (kx, ky, kz) (:meth:`~distpm.parallel.layout.Layout.wavenumbers`),
    made after the array ``after`` if it is not None.

    A gradient makes the initial conditions a second time, in its backward pass
    (``simulation._recompute_bwd``). XLA would share their kernels of k with the
    first making's (common subexpressions) and keep them through the whole
    adjoint of the run; wavenumbers made after the remade modes are not shared.
    The first making keeps its constants: on one device XLA folds what depends
    on k alone while it compiles, and made at run time those values differ in
    the last bit (the particles stay bitwise what they were).
    """
    kvec = layout.wavenumbers(cfg.box_size, dtype)
    if after is None:
        return kvec
    zero = zeros_after((), dtype, after)
    return [k + zero for k in kvec]


def linear_modes(noise, cosmo, layout, cfg, after=None):
    """Linear density modes at a=1 on the local block of the particle grid (k-space layout).

    delta_k = FFT(noise) * sqrt(P(k) N / V), so that V <|delta_k / N|^2> = P(k)
    with N the number of grid points and V the box volume. With
    ``cfg.fixed_amplitude`` the noise amplitude is replaced by its mean,
    |FFT(noise)|^2 = N, keeping only the phases. The k = 0 mode is zero.
    after: see :func:`_wavenumbers` (the same values).
    """
    noise_k = layout.rfft3d(noise)
    n_cells = math.prod(cfg.particle_shape)
    if cfg.fixed_amplitude:
        amplitude = jnp.abs(noise_k)
        nonzero = amplitude > 0
        noise_k = noise_k * jnp.where(
            nonzero, math.sqrt(n_cells) / jnp.where(nonzero, amplitude, 1.0), 0.0
        )
    k = jnp.sqrt(kernels.k_squared(_wavenumbers(layout, cfg, noise.dtype, after)))
    power = resolved(cfg.linear_power)(k, cosmo)
    scale = jnp.sqrt(power * (n_cells / math.prod(cfg.box_size))).astype(noise.dtype)
    return noise_k * scale


_PAIRS = ((0, 1), (0, 2), (1, 2))


def _in_turn(count, make, out):
    """``out`` with ``make(i, out)`` applied for i = 0 .. count-1, in a loop.

    The loop is what keeps memory down: written out, XLA's scheduler runs the
    independent inverse FFTs of all the Hessian components side by side, each
    with its own work fields, and the initial conditions needed 1.6 times the
    step's memory. ``make`` picks its component with ``lax.switch``
    (the same arithmetic as written out: the particles are bitwise the same). Under
    reverse-mode differentiation each component is made again rather than stored.
    """
    return lax.fori_loop(0, count, jax.checkpoint(make), out)


def _potentials(delta_k, layout, cfg, after=None):
    """(gradient kernels, phi1_k, phi2_k, third) on the local k-space block.

    lap(phi1) = delta, lap(phi2) = sum_{i<j} (phi1_ii phi1_jj - phi1_ij^2); phi2_k is None
    for ``cfg.lpt_order == 1``. For 2LPT the Hessian components are made one at a time
    (:func:`_in_turn`), so at most four real fields of them exist at once. ``third`` is
    None below ``lpt_order == 3``, else :func:`_third_order`'s k-space fields.
    """
    kvec = _wavenumbers(layout, cfg, delta_k.real.dtype, after)
    cell = [b / n for b, n in zip(cfg.box_size, cfg.particle_shape, strict=True)]
    deriv = kernels.gradient_kernel(kvec, cell, "ik")
    inv_lap = kernels.inverse_laplacian(kvec)  # -1/k^2
    phi1_k = inv_lap * delta_k
    if cfg.lpt_order == 1:
        return deriv, phi1_k, None, None
    # zeros made from the modes: the remade initial conditions of a gradient would share
    # constant zeros with the first ones, kept through the whole run's adjoint
    real = layout.varying(zeros_after(layout.local_shape, delta_k.real.dtype, delta_k.real))

    def hessian(phi_k, n, pairs):  # component pairs[n] of the Hessian, n traced
        product = lambda i, j: -deriv[i] * deriv[j] * phi_k  # noqa: E731
        return layout.irfft3d(lax.switch(n, [functools.partial(product, *ij) for ij in pairs]))

    def hessians(phi_k, pairs):  # all of pairs, stacked
        stack = jnp.broadcast_to(real, (len(pairs), *real.shape))
        return _in_turn(len(pairs), lambda n, h: h.at[n].set(hessian(phi_k, n, pairs)), stack)

    if cfg.lpt_order == 3:  # all six components are needed again at third order
        six = [(i, j) for i in range(3) for j in range(i, 3)]
        h1 = dict(zip(six, hessians(phi1_k, six), strict=True))
        diagonal = [h1[i, i] for i in range(3)]
    else:
        diagonal = list(hessians(phi1_k, [(i, i) for i in range(3)]))
    source = diagonal[0] * diagonal[1] + diagonal[0] * diagonal[2] + diagonal[1] * diagonal[2]
    if cfg.lpt_order == 3:
        for i, j in _PAIRS:
            source = source - h1[i, j] ** 2
    else:
        source = _in_turn(3, lambda n, src: src - hessian(phi1_k, n, _PAIRS) ** 2, source)
    phi2_k = inv_lap * layout.rfft3d(source)
    if cfg.lpt_order == 2:
        return deriv, phi1_k, phi2_k, None
    h2 = dict(zip(six, hessians(phi2_k, six), strict=True))
    return deriv, phi1_k, phi2_k, _third_order(h1, h2, deriv, inv_lap, layout)


def _third_order(h1, h2, deriv, inv_lap, layout):
    """(phi3a_k, phi3b_k, [s3c_k per axis]) from the Hessians of phi1 and phi2, given as
    dicts (i, j) -> real field for i <= j (see the module doc for the equations)."""

    def h(hess, i, j):
        return hess[min(i, j), max(i, j)]

    det = (
        h1[0, 0] * (h1[1, 1] * h1[2, 2] - h1[1, 2] ** 2)
        - h1[0, 1] * (h1[0, 1] * h1[2, 2] - h1[1, 2] * h1[0, 2])
        + h1[0, 2] * (h1[0, 1] * h1[1, 2] - h1[1, 1] * h1[0, 2])
    )
    phi3a_k = inv_lap * layout.rfft3d(det)
    mixed = sum(
        h1[i, i] * h2[j, j] + h1[j, j] * h2[i, i] - 2.0 * h1[i, j] * h2[i, j] for i, j in _PAIRS
    )
    phi3b_k = inv_lap * layout.rfft3d(mixed)
    # the antisymmetric (H2 H1 - H1 H2)_ij for i < j, in k-space
    curl = {
        (i, j): layout.rfft3d(
            sum(h(h2, i, m) * h(h1, m, j) - h(h1, i, m) * h(h2, m, j) for m in range(3))
        )
        for i, j in _PAIRS
    }

    def transverse(i):
        terms = [
            (1 if i < j else -1) * 1j * deriv[j] * curl[min(i, j), max(i, j)]
            for j in range(3)
            if j != i
        ]
        return inv_lap * (terms[0] + terms[1])

    return phi3a_k, phi3b_k, [transverse(i) for i in range(3)]


def _terms(potentials):
    """The LPT terms s1, s2 and s3a, s3b, s3c, as far as the order goes, in the order they
    are summed: (sign, the k-space field of the term along an axis (an int))."""
    deriv, phi1_k, phi2_k, third = potentials

    def gradient(phi_k):  # grad(phi) along an axis, in k-space
        return lambda axis: 1j * deriv[axis] * phi_k

    terms = [(-1.0, gradient(phi1_k))]
    if phi2_k is not None:
        terms.append((1.0, gradient(phi2_k)))
    if third is not None:
        phi3a_k, phi3b_k, s3c_k = third
        terms += [(-1.0, gradient(phi3a_k)), (-1.0, gradient(phi3b_k)), (1.0, s3c_k.__getitem__)]
    return terms


def _axis_terms(potentials, axis: int, layout):
    """The terms (:func:`_terms`) along ``axis`` [Mpc/h], each (n,) on the local block of
    the particle grid (local C order)."""
    return [sign * layout.irfft3d(field(axis)).reshape(-1) for sign, field in _terms(potentials)]


def lpt_displacements(delta_k, layout, cfg):
    """(s1, s2, s3) [Mpc/h] on the local block of the particle grid (local C order).

    s1 = -grad(phi1), s2 = grad(phi2) (see :func:`_potentials`), each (n, 3); s2 is None
    for ``cfg.lpt_order == 1``; s3 is None below 3LPT and the (n, 3) fields
    (s3a, s3b, s3c) for it (module doc). Derivatives are spectral (i k), with the
    Nyquist frequency zeroed.
    """
    potentials = _potentials(delta_k, layout, cfg)
    per_axis = [_axis_terms(potentials, axis, layout) for axis in range(3)]
    s = [jnp.stack(term, axis=-1) for term in zip(*per_axis, strict=True)]
    return s[0], s[1] if len(s) > 1 else None, tuple(s[2:]) if len(s) > 2 else None


def lpt(delta_k, cosmo, layout, cfg, a=None, after=None, slots=None, in_turn=True):
    """Positions and momenta at scale factor ``a`` (default ``cfg.a_start``) from linear modes.

    delta_k: linear modes at a=1 from :func:`linear_modes` (local block).
    Returns (pos (n, 3) [Mpc/h] wrapped into the box, vel (n, 3) [100 km/s],
    ids (n, 2)) of the local block of the particle grid, in local C order.
    after: see :func:`_wavenumbers` (the same values). slots: None, or the rows
    (at least n) of the arrays returned: the particles in the first n, zeros after.

    in_turn: the arrays are made once the potentials are, and each term of each
    axis (:func:`_terms`: one inverse FFT) is added into its column in turn, in a
    loop (written out, XLA's scheduler makes every inverse FFT first and keeps
    them all): no other (n, 3) array exists, and they can be a run's particle
    buffers. False writes the terms out, for reverse-mode differentiation, whose
    derivative of the loop would store the arrays at each of its iterations.
    Both sum the terms in their order: the same values.
    """
    a = cfg.a_start if a is None else a
    dtype = delta_k.real.dtype
    table = background.growth_table(cosmo, order=max(2, cfg.lpt_order))
    d1, f1, d2, f2 = background.growth(a, table)
    e = background.E(a, cosmo)
    # per term: the factors of its displacement and momentum (D' = dD/dlna = f D)
    factors = [(d1, f1 * d1), (d2, f2 * d2)][: min(cfg.lpt_order, 2)]
    if cfg.lpt_order == 3:
        factors += list(background.growth3(a, table))
    factors = [jnp.stack(f) for f in zip(*factors, strict=True)]  # displacement, momentum
    potentials = _potentials(delta_k, layout, cfg, after)
    n = math.prod(layout.local_shape)
    pad = lambda x: jnp.pad(x, [(0, (slots or n) - n), (0, 0)])  # noqa: E731
    lattice = functools.partial(lagrangian_column, cfg, layout, dtype, after=after)
    box = jnp.asarray(cfg.box_size, dtype)

    def add(sums, s, term):  # the displacement's and momentum's sums with term ``term``
        first = term == 0
        return [
            jnp.where(first, f[term] * s, c + f[term] * s)
            for c, f in zip(sums, factors, strict=True)
        ]

    def particle(sums, q, axis=None):  # the positions and momenta of the sums
        disp, mom = sums
        edge = box if axis is None else box[axis]  # by column, or of one axis
        return wrap(q + disp.astype(dtype), edge), (a**2 * e * mom).astype(dtype)

    if not in_turn:
        columns = []
        for axis in range(3):
            sums = [0.0, 0.0]
            for term, s in enumerate(_axis_terms(potentials, axis, layout)):
                sums = add(sums, s, term)
            columns.append(particle(sums, lattice(axis), axis))
        pos, vel = (pad(jnp.stack(c, axis=-1)) for c in zip(*columns, strict=True))
        return pos, vel, pad(lagrangian_block(cfg, layout, dtype, after)[1])

    terms = _terms(potentials)
    count = len(terms)
    signs = jnp.asarray([sign for sign, _ in terms], dtype)
    fields = [lambda i=i, f=f: f(i // count) for i, (_, f) in enumerate(terms * 3)]
    rows = (slots or n, 3)

    def add_in_turn(i, particles):  # term i % count of axis i // count
        axis, term = i // count, i % count
        s = signs[term] * layout.irfft3d(lax.switch(i, fields)).reshape(-1)
        s = jnp.pad(s, (0, rows[0] - n))[:, None]  # each row's term, for all three columns
        sums = add(particles, s, term)
        # the lattice is made here, from s: made before the loop, XLA would keep it
        q = pad(lagrangian_block(cfg, layout, dtype, s)[0])
        last = term == count - 1
        done = [jnp.where(last, p, c) for p, c in zip(particle(sums, q), sums, strict=True)]
        # every element is rewritten, those of column ``axis`` with their new values: no
        # column is cut out (a slice of a column, or one written into the arrays, would be
        # a buffer of its own), and XLA updates each array in place
        # (indices made from s too: made before the loop, XLA would keep them, as arrays)
        row = lax.broadcasted_iota(jnp.int32, (rows[0], 1), 0) + zeros_after((), jnp.int32, s)
        here = (lax.broadcasted_iota(jnp.int32, (1, 3), 1) == axis) & (row < n)
        return tuple(
            jnp.where(here, c.astype(dtype), x) for x, c in zip(particles, done, strict=True)
        )

    last = jax.tree.leaves(potentials)[-1]  # the arrays are made after it (two: not one)
    zeros = (zeros_after(rows, dtype, last.real), zeros_after(rows, dtype, last.imag))
    pos, vel = lax.fori_loop(0, 3 * count, add_in_turn, zeros)
    # the ids are made last (after the positions): made first, their columns were kept
    return pos, vel, pad(lagrangian_block(cfg, layout, dtype, pos)[1])
