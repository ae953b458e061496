"""Background expansion and growth to third order for flat w0waCDM.

Conventions
-----------
- Time variable: scale factor ``a`` (dimensionless, a = 1 today); the growth
  ODEs are integrated in ``x = ln a``.
- ``E(a) = H(a) / H0`` (dimensionless). Flat universe, no radiation, no
  neutrinos: ``E^2 = Om a^-3 + Ode a^{-3(1+w0+wa)} exp(-3 wa (1-a))``.
- Growth: D1 is the linear growth factor, D2 the second-order (2LPT) one,
  normalised so that ``D1(a=1) = 1`` and D2 by the same factor squared, so
  that ``D2 ~= -3/7 D1^2`` at early times (D2 is *negative*). 2LPT sign
  convention (Scoccimarro 1998; Crocce, Pueblas & Scoccimarro 2006):
  ``x = q + D1 s1 + D2 s2`` with ``s1 = -grad phi1``, ``lap phi1 = delta_lin``
  (at a=1) and ``s2 = +grad phi2``,
  ``lap phi2 = sum_{i>j} (phi1_ii phi1_jj - phi1_ij^2)``.
- Third order (3LPT, tables made with ``order=3``): ``D3a``, ``D3b`` and the
  transverse ``D3c`` multiply ``s3a = -grad phi3a`` (``lap phi3a = det phi1_ij``),
  ``s3b = -grad phi3b`` (``lap phi3b = tr phi1_ij tr phi2_ij - tr(phi1_ij phi2_ij)``)
  and ``s3c`` (see :mod:`distpm.ic`), normalised by D1(1)^3; in matter domination
  ``D3a = -1/3 D1^3``, ``D3b = 5/21 D1^3``, ``D3c = 1/7 D1^3``.
- Growth rates ``f = dlnD/dlna`` (dimensionless).

Everything is pure JAX: differentiable with respect to every cosmological
parameter, jit-able, and computed in the floating dtype of the inputs
(float32 unless the caller enables x64). No global state is touched.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from distpm.cosmology import Cosmology
from distpm.units import C_OVER_H0

__all__ = [
    "E",
    "dlnE_dlna",
    "Omega_m_of_a",
    "GrowthTable",
    "growth_table",
    "growth",
    "growth3",
    "growth_factor",
    "growth_rate",
    "C_OVER_H0",
    "DistanceTable",
    "distance_table",
    "comoving_distance",
]

A_MIN = 1e-4  # default start of the growth integration (deep in matter domination)


def _dtype(cosmo: Cosmology, *arrays):
    """Floating dtype of the computation: that of the cosmology leaves and inputs."""
    return jnp.result_type(float, *jax.tree_util.tree_leaves(cosmo), *arrays)


def _terms(lna, cosmo: Cosmology):
    """Matter and dark-energy terms of E^2 at ``lna``, and d ln(rho_de)/d ln a."""
    w0, wa = cosmo.w0, cosmo.wa
    m = cosmo.Omega_m * jnp.exp(-3.0 * lna)
    dlnde = -3.0 * (1.0 + w0 + wa) + 3.0 * wa * jnp.exp(lna)
    de = cosmo.Omega_de * jnp.exp(-3.0 * (1.0 + w0 + wa) * lna - 3.0 * wa * (1.0 - jnp.exp(lna)))
    return m, de, dlnde


def _E2_dlnE_Om(lna, cosmo: Cosmology):
    m, de, dlnde = _terms(lna, cosmo)
    E2 = m + de
    return E2, 0.5 * (-3.0 * m + dlnde * de) / E2, m / E2


def E(a, cosmo: Cosmology):
    """Dimensionless Hubble rate H(a)/H0 at scale factor ``a``."""
    a = jnp.asarray(a, _dtype(cosmo, a))
    return jnp.sqrt(_E2_dlnE_Om(jnp.log(a), cosmo)[0])


def dlnE_dlna(a, cosmo: Cosmology):
    """d ln E / d ln a (analytic), dimensionless; -3/2 in matter domination."""
    a = jnp.asarray(a, _dtype(cosmo, a))
    return _E2_dlnE_Om(jnp.log(a), cosmo)[1]


def Omega_m_of_a(a, cosmo: Cosmology):
    """Matter density parameter at ``a``: Om a^-3 / E(a)^2."""
    a = jnp.asarray(a, _dtype(cosmo, a))
    return _E2_dlnE_Om(jnp.log(a), cosmo)[2]


def _rhs(y, dlnE, om):
    """d/dlna of y = (D1, D1', D2, D2'[, D3a, D3a', D3b, D3b', D3c, D3c']) given dlnE/dlna
    and Omega_m(a); primes = d/dlna. The third order (y of length 10) is Lagrangian
    perturbation theory's growing mode: with L[D] = D'' + (2 + dlnE) D' - 3/2 Om D,
    L[D3a] = -3 Om D1^3, L[D3b] = -3/2 Om D1 (D2 - D1^2), and the transverse
    D3c'' + (2 + dlnE) D3c' = 3/2 Om D1^3."""
    d1, d1p, d2, d2p = y[:4]
    d1pp = -(2.0 + dlnE) * d1p + 1.5 * om * d1
    d2pp = -(2.0 + dlnE) * d2p + 1.5 * om * (d2 - d1 * d1)
    if y.shape[0] == 4:
        return jnp.stack([d1p, d1pp, d2p, d2pp])
    d3a, d3ap, d3b, d3bp, d3c, d3cp = y[4:]
    d1_cubed = d1 * d1 * d1
    d3app = -(2.0 + dlnE) * d3ap + 1.5 * om * (d3a - 2.0 * d1_cubed)
    d3bpp = -(2.0 + dlnE) * d3bp + 1.5 * om * (d3b - d1 * (d2 - d1 * d1))
    d3cpp = -(2.0 + dlnE) * d3cp + 1.5 * om * d1_cubed
    return jnp.stack([d1p, d1pp, d2p, d2pp, d3ap, d3app, d3bp, d3bpp, d3cp, d3cpp])


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class GrowthTable:
    """Growth factors tabulated on a uniform grid in ln a (build with :func:`growth_table`).

    lna: the grid, ln a (uniform step, contains ln a = 0 exactly).
    D1, dD1, d2D1: D1 and its first and second derivatives w.r.t. ln a.
    D2, dD2, d2D2: same for the second-order growth factor (negative, see module doc).
    a_min, a_max: valid range of ``a`` (static Python floats).
    D3, dD3, d2D3: (n, 3) columns D3a, D3b, D3c and their derivatives (tables made
        with ``order=3``; None otherwise).
    """

    lna: jax.Array
    D1: jax.Array
    dD1: jax.Array
    d2D1: jax.Array
    D2: jax.Array
    dD2: jax.Array
    d2D2: jax.Array
    a_min: float = dataclasses.field(metadata=dict(static=True))
    a_max: float = dataclasses.field(metadata=dict(static=True))
    D3: jax.Array | None = None
    dD3: jax.Array | None = None
    d2D3: jax.Array | None = None


def growth_table(
    cosmo: Cosmology,
    a_max: float = 2.0,
    *,
    a_min: float = A_MIN,
    num_steps: int = 512,
    order: int = 2,
) -> GrowthTable:
    """Integrate the growth ODEs with fixed-step RK4 (``lax.scan``) in x = ln a.

    D1'' + (2 + dlnE/dlna) D1' = 3/2 Om(a) D1
    D2'' + (2 + dlnE/dlna) D2' = 3/2 Om(a) (D2 - D1^2)

    starting at ``a_min`` with the matter-domination growing modes
    D1 = D1' = a, D2 = -3/7 a^2, D2' = -6/7 a^2, then normalised to D1(1) = 1.
    ``order=3`` adds the third-order factors (module doc; their equations in
    :func:`_rhs`), started at D3a = -a^3/3, D3b = 5/21 a^3, D3c = a^3/7.
    ``num_steps`` RK4 steps span [a_min, 1]; the same step continues up to (at
    least) ``a_max``. The default (512) gives D1 to ~1e-8 relative in float64.

    a_max, a_min: static Python floats with a_min < 1 <= a_max.
    """
    a_max, a_min = float(a_max), float(a_min)
    if not (0.0 < a_min < 1.0 <= a_max):
        raise ValueError(
            f"growth_table needs 0 < a_min < 1 <= a_max (growth is normalised at a=1); "
            f"got a_min={a_min}, a_max={a_max}"
        )
    if int(num_steps) < 16:
        raise ValueError(f"num_steps={num_steps} is too small; use a few hundred")
    if order not in (2, 3):
        raise ValueError(f"growth_table order must be 2 or 3, got {order!r}")
    dx = -math.log(a_min) / num_steps
    n_after = max(1, math.ceil(math.log(a_max) / dx - 1e-9))
    arrays = _integrate(cosmo, a_min, int(num_steps), n_after, order)
    return GrowthTable(*arrays[:7], a_min=a_min, a_max=math.exp(n_after * dx), **arrays[7])


@functools.partial(jax.jit, static_argnums=(1, 2, 3, 4))
def _integrate(cosmo: Cosmology, a_min: float, num_steps: int, n_after: int, order: int):
    """RK4 from a_min to exp(n_after * dx); returns the GrowthTable arrays, the third-order
    ones in a dict (empty for ``order == 2``)."""
    dtype = _dtype(cosmo)
    dx = -math.log(a_min) / num_steps
    lna = (jnp.arange(num_steps + n_after + 1) - num_steps).astype(dtype) * dx
    a0 = jnp.asarray(a_min, dtype)
    y0 = jnp.stack([a0, a0, -3.0 / 7.0 * a0**2, -6.0 / 7.0 * a0**2])
    if order == 3:
        cubed = [-1.0 / 3.0, 5.0 / 21.0, 1.0 / 7.0]  # matter-domination growing modes x a^3
        y0 = jnp.concatenate([y0, jnp.stack([c * m * a0**3 for c in cubed for m in (1, 3)])])

    # The background depends on x only: evaluate it once on the nodes and midpoints.
    _, dlnE, om = _E2_dlnE_Om(jnp.concatenate([lna, lna[:-1] + 0.5 * dx]), cosmo)
    n = lna.shape[0]
    start, mid, end = (dlnE[: n - 1], om[: n - 1]), (dlnE[n:], om[n:]), (dlnE[1:n], om[1:n])

    def step(y, bg):
        b0, bm, b1 = bg
        k1 = _rhs(y, *b0)
        k2 = _rhs(y + 0.5 * dx * k1, *bm)
        k3 = _rhs(y + 0.5 * dx * k2, *bm)
        k4 = _rhs(y + dx * k3, *b1)
        return y + dx / 6.0 * (k1 + 2.0 * k2 + 2.0 * k3 + k4), (y, k1)

    y_last, (ys, dys) = jax.lax.scan(step, y0, (start, mid, end))
    ys = jnp.concatenate([ys, y_last[None]], axis=0)  # (n, 4): D1, D1', D2, D2'[, third]
    dys = jnp.concatenate([dys, _rhs(y_last, dlnE[n - 1], om[n - 1])[None]], axis=0)
    norm = ys[num_steps, 0]  # D1 at a = 1 (an exact grid node)
    s1, s2 = 1.0 / norm, 1.0 / norm**2
    third = {}
    if order == 3:
        s3 = s2 / norm
        third = dict(D3=ys[:, 4::2] * s3, dD3=ys[:, 5::2] * s3, d2D3=dys[:, 5::2] * s3)
    return (
        lna,
        ys[:, 0] * s1,
        ys[:, 1] * s1,
        dys[:, 1] * s1,
        ys[:, 2] * s2,
        ys[:, 3] * s2,
        dys[:, 3] * s2,
        third,
    )


def _check_range(a, table: GrowthTable):
    """Raise ValueError for concrete ``a`` outside the table (no-op when traced)."""
    try:
        a_np = np.asarray(a, dtype=np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    lo, hi = table.a_min * (1 - 1e-6), table.a_max * (1 + 1e-6)
    bad = ~((a_np >= lo) & (a_np <= hi))
    if np.any(bad):
        raise ValueError(
            f"scale factor a={a_np[bad].ravel()[:5]} outside the growth table range "
            f"[{table.a_min:g}, {table.a_max:g}]; build the table with "
            f"growth_table(cosmo, a_max=...) / a_min=... to cover it"
        )


def _hermite(t, h, y0, y1, m0, m1):
    """Cubic Hermite interpolant on [0, 1] with node values y and slopes m (per unit x)."""
    t2, t3 = t * t, t * t * t
    return (
        (2 * t3 - 3 * t2 + 1) * y0
        + (t3 - 2 * t2 + t) * h * m0
        + (-2 * t3 + 3 * t2) * y1
        + (t3 - t2) * h * m1
    )


def growth(a, table: GrowthTable):
    """Growth factors and rates at scale factor ``a`` (any shape).

    Returns ``(D1, f1, D2, f2)`` with f = dlnD/dlna, by cubic Hermite
    interpolation in ln a using the tabulated derivatives (D and D' are each
    interpolated with their own derivative, so f is accurate to ~1e-8).

    Valid range: ``table.a_min <= a <= table.a_max``. A concrete ``a`` outside
    it raises ValueError; a traced one (inside jit/grad w.r.t. a) gives NaN
    there rather than a silently extrapolated value.
    """
    _check_range(a, table)
    return _interp(a, table)


@jax.jit
def _interp(a, table: GrowthTable):
    a = jnp.asarray(a, jnp.result_type(float, table.lna, a))
    interp = _interpolator(a, table)
    d1, d1p = interp(table.D1, table.dD1), interp(table.dD1, table.d2D1)
    d2, d2p = interp(table.D2, table.dD2), interp(table.dD2, table.d2D2)
    return _in_range(a, table, (d1, d1p / d1, d2, d2p / d2))


def _interpolator(a, table: GrowthTable):
    """Cubic Hermite interpolation in ln a at ``a``: a function of (values, slopes)."""
    n = table.lna.shape[0]
    x0 = math.log(table.a_min)
    h = (math.log(table.a_max) - x0) / (n - 1)  # grid step, from the static range (exact)
    u = (jnp.log(a) - x0) / h
    i = jnp.clip(jnp.floor(u).astype(jnp.int32), 0, n - 2)
    t = u - i
    return lambda y, m: _hermite(t, h, y[i], y[i + 1], m[i], m[i + 1])


def _in_range(a, table: GrowthTable, values):
    """``values`` where ``a`` lies in the table's range, NaN elsewhere."""
    lo, hi = table.a_min * (1 - 1e-6), table.a_max * (1 + 1e-6)
    ok = (a >= lo) & (a <= hi)
    nan = jnp.asarray(jnp.nan, a.dtype)
    return tuple(jnp.where(ok, v, nan) for v in values)


def growth3(a, table: GrowthTable):
    """Third-order growth factors at scale factor ``a`` (any shape), from a table made
    with ``order=3``: ``((D3a, D3a'), (D3b, D3b'), (D3c, D3c'))`` with ' = d/dlna.

    The momenta need D' itself, so it is returned rather than a rate D'/D.
    Range and NaN behaviour as :func:`growth`.
    """
    if table.D3 is None:
        raise ValueError("this growth table has no third order; make it with order=3")
    _check_range(a, table)
    return _interp3(a, table)


@jax.jit
def _interp3(a, table: GrowthTable):
    a = jnp.asarray(a, jnp.result_type(float, table.lna, a))
    interp = _interpolator(a, table)
    values = []
    for c in range(3):
        d, dd, ddd = table.D3[:, c], table.dD3[:, c], table.d2D3[:, c]
        values += [interp(d, dd), interp(dd, ddd)]
    values = _in_range(a, table, values)
    return tuple(zip(values[::2], values[1::2], strict=True))


def _table_for(a, cosmo: Cosmology) -> GrowthTable:
    """A default table that covers concrete ``a`` beyond the default a_max = 2."""
    a_max = 2.0
    try:
        a_np = np.asarray(a, dtype=np.float64)
        if a_np.size and np.all(np.isfinite(a_np)):
            a_max = max(a_max, float(a_np.max()))
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        pass
    return growth_table(cosmo, a_max=a_max)


def growth_factor(a, cosmo: Cosmology):
    """Linear growth factor D1(a), normalised to D1(1) = 1 (builds a table; a >= 1e-4)."""
    return growth(a, _table_for(a, cosmo))[0]


def growth_rate(a, cosmo: Cosmology):
    """Linear growth rate f1(a) = dlnD1/dlna (builds a table; a >= 1e-4)."""
    return growth(a, _table_for(a, cosmo))[1]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class DistanceTable:
    """Comoving distance chi(a) on a uniform grid in ln a (build with :func:`distance_table`).

    chi: [Mpc/h] chi(a) = c/H0 int_a^1 da' / (a'^2 E(a')) at the nodes ``lna``;
    dchi: d chi / d ln a = -c/H0 / (a E(a)) there. a_min: static lower end (a_max = 1).
    """

    lna: jax.Array
    chi: jax.Array
    dchi: jax.Array
    a_min: float = dataclasses.field(metadata=dict(static=True))


def distance_table(cosmo: Cosmology, *, a_min: float = 1e-3, num_steps: int = 2048):
    """Tabulate the comoving distance from a = 1 down to ``a_min`` (flat universe).

    Each interval is integrated exactly for the cubic Hermite interpolant of
    the integrand (trapezoid plus its end-slope correction, O(h^4)): 2048
    steps down to a = 1e-3 give chi to ~1e-9 relative in float64.
    Differentiable in ``cosmo``.
    """
    a_min = float(a_min)
    if not 0.0 < a_min < 1.0:
        raise ValueError(f"distance_table needs 0 < a_min < 1, got a_min={a_min}")
    dtype = _dtype(cosmo)
    lna = jnp.linspace(math.log(a_min), 0.0, int(num_steps) + 1, dtype=dtype)
    h = -math.log(a_min) / int(num_steps)
    E2, dlnE, _ = _E2_dlnE_Om(lna, cosmo)
    f = 1.0 / (jnp.exp(lna) * jnp.sqrt(E2))  # d(chi H0/c) / d(-ln a)
    df = -(1.0 + dlnE) * f  # d f / d ln a
    pieces = 0.5 * h * (f[1:] + f[:-1]) + h * h / 12.0 * (df[:-1] - df[1:])
    tail = jnp.concatenate([jnp.cumsum(pieces[::-1])[::-1], jnp.zeros((1,), dtype)])
    return DistanceTable(lna=lna, chi=C_OVER_H0 * tail, dchi=-C_OVER_H0 * f, a_min=a_min)


def comoving_distance(a, table: DistanceTable):
    """Comoving distance chi(a) [Mpc/h] by cubic Hermite interpolation of ``table``.

    Valid for table.a_min <= a <= 1; NaN outside (no silent extrapolation).
    """
    a = jnp.asarray(a, jnp.result_type(float, table.chi, a))
    n = table.lna.shape[0]
    x0 = math.log(table.a_min)
    h = -x0 / (n - 1)
    u = (jnp.log(a) - x0) / h
    i = jnp.clip(jnp.floor(u).astype(jnp.int32), 0, n - 2)
    t = u - i
    chi = _hermite(t, h, table.chi[i], table.chi[i + 1], table.dchi[i], table.dchi[i + 1])
    ok = (a >= table.a_min * (1 - 1e-6)) & (a <= 1.0 + 1e-6)
    return jnp.where(ok, chi, jnp.nan)
