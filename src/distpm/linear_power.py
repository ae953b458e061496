"""Linear matter power spectrum: Eisenstein & Hu (1998) fits and tabulated P(k).

Units: k in [h/Mpc], P(k) in [(Mpc/h)^3], R in [Mpc/h].

``P(k, a) = D1(a)^2 A k^n_s T(k)^2`` with A fixed so that sigma(R = 8 Mpc/h)
at a = 1 equals ``cosmo.sigma8`` (real-space top-hat window). D1 is the ODE
growth factor of :mod:`distpm.background` (D1(1) = 1). Everything is pure JAX
and differentiable w.r.t. Omega_c, Omega_b, h, n_s, sigma8; k = 0 gives P = 0
with finite (zero) gradients.

Reference: Eisenstein & Hu 1998, ApJ 496, 605 (EH98); equation numbers below
refer to it.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from distpm import boltzmann
from distpm.background import GrowthTable, _table_for, growth
from distpm.cosmology import Cosmology

__all__ = [
    "KINDS",
    "NAMED",
    "transfer_eh",
    "tophat_window",
    "sigma_R",
    "sigma8",
    "linear_power",
    "load_power_table",
    "Spectrum",
    "resolved",
]

KINDS = ("eisenstein_hu", "eisenstein_hu_nowiggle", "table", "camb")
NAMED = tuple(k for k in KINDS if k != "table")  # what a config names (else a table file)


def _dtype(cosmo: Cosmology, *arrays):
    return jnp.result_type(float, *jax.tree_util.tree_leaves(cosmo), *arrays)


def _eh98_bao(k, cosmo: Cosmology):
    """EH98 full transfer function (CDM + baryons with BAO), k [h/Mpc] > 0."""
    h, om, ob = cosmo.h, cosmo.Omega_m, cosmo.Omega_b
    fb, fc = ob / om, cosmo.Omega_c / om
    omh2, obh2 = om * h**2, ob * h**2
    th = cosmo.T_cmb / 2.7

    z_eq = 2.50e4 * omh2 * th**-4  # eq 2
    k_eq = 7.46e-2 * omh2 * th**-2  # eq 3 [1/Mpc]
    b1 = 0.313 * omh2**-0.419 * (1.0 + 0.607 * omh2**0.674)  # eq 4
    b2 = 0.238 * omh2**0.223
    z_d = 1291.0 * omh2**0.251 / (1.0 + 0.659 * omh2**0.828) * (1.0 + b1 * obh2**b2)
    R_d = 31.5 * obh2 * th**-4 * (1e3 / z_d)  # eq 5
    R_eq = 31.5 * obh2 * th**-4 * (1e3 / z_eq)
    s = (  # sound horizon at drag, eq 6 [Mpc]
        2.0
        / (3.0 * k_eq)
        * jnp.sqrt(6.0 / R_eq)
        * jnp.log((jnp.sqrt(1.0 + R_d) + jnp.sqrt(R_d + R_eq)) / (1.0 + jnp.sqrt(R_eq)))
    )
    k_silk = 1.6 * obh2**0.52 * omh2**0.73 * (1.0 + (10.4 * omh2) ** -0.95)  # eq 7 [1/Mpc]
    a1 = (46.9 * omh2) ** 0.670 * (1.0 + (32.1 * omh2) ** -0.532)  # eq 11
    a2 = (12.0 * omh2) ** 0.424 * (1.0 + (45.0 * omh2) ** -0.582)
    alpha_c = a1**-fb * a2 ** (-(fb**3))
    bb1 = 0.944 / (1.0 + (458.0 * omh2) ** -0.708)  # eq 12
    bb2 = (0.395 * omh2) ** -0.0266
    beta_c = 1.0 / (1.0 + bb1 * (fc**bb2 - 1.0))
    y = (1.0 + z_eq) / (1.0 + z_d)
    sy = jnp.sqrt(1.0 + y)
    G = y * (-6.0 * sy + (2.0 + 3.0 * y) * jnp.log((sy + 1.0) / (sy - 1.0)))  # eq 15
    alpha_b = 2.07 * k_eq * s * (1.0 + R_d) ** -0.75 * G  # eq 14
    beta_node = 8.41 * omh2**0.435  # eq 23
    beta_b = 0.5 + fb + (3.0 - 2.0 * fb) * jnp.sqrt((17.2 * omh2) ** 2 + 1.0)  # eq 24

    # k-dependent part
    kk = k * h  # [1/Mpc]
    q = kk / (13.41 * k_eq)  # eq 10
    ks = kk * s

    def t0(alpha, beta):  # eqs 19-20
        lg = jnp.log(jnp.e + 1.8 * beta * q)
        c = 14.2 / alpha + 386.0 / (1.0 + 69.9 * q**1.08)
        return lg / (lg + c * q**2)

    f = 1.0 / (1.0 + (ks / 5.4) ** 4)  # eq 18
    t_c = f * t0(1.0, beta_c) + (1.0 - f) * t0(alpha_c, beta_c)  # eq 17
    s_tilde = s / (1.0 + (beta_node / ks) ** 3) ** (1.0 / 3.0)  # eq 22
    x = kk * s_tilde
    t_b = (  # eq 21
        t0(1.0, 1.0) / (1.0 + (ks / 5.2) ** 2)
        + alpha_b / (1.0 + (beta_b / ks) ** 3) * jnp.exp(-((kk / k_silk) ** 1.4))
    ) * (jnp.sin(x) / x)
    return fb * t_b + fc * t_c  # eq 16


def _eh98_nowiggle(k, cosmo: Cosmology):
    """EH98 zero-baryon-oscillation ("no-wiggle") fit, section 4.2, eqs 26-31."""
    h, om = cosmo.h, cosmo.Omega_m
    fb = cosmo.Omega_b / om
    omh2, obh2 = om * h**2, cosmo.Omega_b * h**2
    th = cosmo.T_cmb / 2.7
    s = 44.5 * jnp.log(9.83 / omh2) / jnp.sqrt(1.0 + 10.0 * obh2**0.75)  # eq 26 [Mpc]
    alpha = 1.0 - 0.328 * jnp.log(431.0 * omh2) * fb + 0.38 * jnp.log(22.3 * omh2) * fb**2
    gamma = om * h * (alpha + (1.0 - alpha) / (1.0 + (0.43 * k * h * s) ** 4))  # eq 30
    q = k * th**2 / gamma  # eq 28 (k in h/Mpc)
    l0 = jnp.log(2.0 * jnp.e + 1.8 * q)  # eq 29
    c0 = 14.2 + 731.0 / (1.0 + 62.5 * q)
    return l0 / (l0 + c0 * q**2)


def _safe(fn, k, fill):
    """fn(k) for k > 0, ``fill`` elsewhere, with no NaN in values or gradients."""
    pos = k > 0
    return jnp.where(pos, fn(jnp.where(pos, k, 1.0)), fill)


def transfer_eh(k, cosmo: Cosmology, *, wiggles: bool = True):
    """Eisenstein & Hu (1998) matter transfer function T(k), T -> 1 as k -> 0.

    k: wavenumber [h/Mpc], any shape, >= 0 (T(0) = 1).
    wiggles: True for the full fit with baryon acoustic oscillations (EH98
      section 3), False for the smooth no-wiggle fit (section 4.2).
    Uses Omega_m, Omega_b, h and T_cmb of ``cosmo``.
    """
    k = jnp.asarray(k, _dtype(cosmo, k))
    fn = _eh98_bao if wiggles else _eh98_nowiggle
    return _safe(lambda kk: fn(kk, cosmo), k, 1.0)


def tophat_window(x):
    """Fourier transform of a real-space top-hat, W(x) = 3 (sin x - x cos x) / x^3.

    Uses the Taylor series for x < 0.5 (no cancellation in float32, W(0) = 1).
    """
    x = jnp.asarray(x)
    small = x < 0.5
    xs = jnp.where(small, 1.0, x)
    big = 3.0 * (jnp.sin(xs) - xs * jnp.cos(xs)) / xs**3
    x2 = x * x
    series = 1.0 + x2 * (-1 / 10 + x2 * (1 / 280 + x2 * (-1 / 15120 + x2 / 1330560)))
    return jnp.where(small, series, big)


def _log_grid(k_min, k_max, num):
    if num < 3 or num % 2 == 0:
        raise ValueError(f"num={num} must be odd and >= 3 for Simpson's rule")
    if not 0 < k_min < k_max:
        raise ValueError(f"need 0 < k_min < k_max, got k_min={k_min}, k_max={k_max}")
    return np.exp(np.linspace(math.log(k_min), math.log(k_max), num))


def _sigma_on_grid(R, k, pk):
    """sigma(R) from P on the log grid k (Simpson in ln k)."""
    dx = math.log(k[-1] / k[0]) / (k.shape[0] - 1)
    wts = np.ones(k.shape[0])
    wts[1:-1:2], wts[2:-1:2] = 4.0, 2.0
    wts *= dx / (3.0 * 2.0 * math.pi**2)
    k = jnp.asarray(k, pk.dtype)
    w = tophat_window(k * jnp.asarray(R, pk.dtype)[..., None])
    return jnp.sqrt(jnp.sum(k**3 * pk * w**2 * wts.astype(pk.dtype), axis=-1))


def sigma_R(R, pk_fn, *, k_min: float = 1e-5, k_max: float = 1e2, num: int = 4097):
    """RMS linear density contrast in real-space top-hat spheres of radius R.

    sigma^2(R) = int dlnk k^3 P(k) W(kR)^2 / (2 pi^2), composite Simpson on
    ``num`` (odd) log-spaced points between k_min and k_max [h/Mpc]; the default
    is accurate to ~1e-8 relative for LCDM-like spectra and R ~ 1-100 Mpc/h.

    R: radius [Mpc/h], scalar or array. pk_fn: callable k [h/Mpc] -> P(k)
    [(Mpc/h)^3]; it is called once on the k grid (shape (num,)).
    """
    k = _log_grid(k_min, k_max, num)
    return _sigma_on_grid(R, k, jnp.asarray(pk_fn(k)))


def _check_table(k, pk):
    """Host-side validation of a tabulated (k, P) (skipped for traced arrays)."""
    try:
        k, pk = np.asarray(k, np.float64), np.asarray(pk, np.float64)
    except (jax.errors.TracerArrayConversionError, jax.errors.ConcretizationTypeError):
        return
    if k.ndim != 1 or k.shape != pk.shape or k.size < 2:
        raise ValueError(
            f"power table must be two 1-D arrays of equal length >= 2; got k{k.shape}, P{pk.shape}"
        )
    for name, v in (("k", k), ("P", pk)):
        if not np.all(np.isfinite(v)):
            raise ValueError(
                f"power table: {name} has non-finite values at rows "
                f"{np.flatnonzero(~np.isfinite(v))[:5].tolist()}"
            )
        if np.any(v <= 0):
            i = np.flatnonzero(v <= 0)[:5]
            raise ValueError(
                f"power table: {name} must be > 0 (log-log interpolation); "
                f"rows {i.tolist()} have {name}={v[i].tolist()}"
            )
    if np.any(np.diff(k) <= 0):
        i = int(np.flatnonzero(np.diff(k) <= 0)[0])
        raise ValueError(
            f"power table: k must be strictly increasing; "
            f"k[{i}]={k[i]:g} >= k[{i + 1}]={k[i + 1]:g}"
        )


def _interp_loglog(k, k_tab, p_tab):
    """Linear interpolation in (ln k, ln P); power law with the end slopes outside."""
    x, xt, yt = jnp.log(k), jnp.log(k_tab), jnp.log(p_tab)
    i = jnp.clip(jnp.searchsorted(xt, x) - 1, 0, xt.shape[0] - 2)
    t = (x - xt[i]) / (xt[i + 1] - xt[i])  # not clipped: extrapolates the end segments
    return jnp.exp(yt[i] + t * (yt[i + 1] - yt[i]))


def _shape(kind, cosmo, table, dtype):
    """Unnormalised P(k) (k > 0) for ``kind``."""
    if kind in ("table", "camb"):
        k_tab, p_tab = (
            boltzmann.table(cosmo, dtype)
            if kind == "camb"
            else (jnp.asarray(v, dtype) for v in table)
        )
        return lambda k: _interp_loglog(k, k_tab, p_tab)
    wiggles = kind == "eisenstein_hu"
    fn = _eh98_bao if wiggles else _eh98_nowiggle
    return lambda k: k**cosmo.n_s * fn(k, cosmo) ** 2


def _validate(kind, table):
    if kind not in KINDS:
        raise ValueError(f"unknown linear power kind={kind!r}; valid kinds: {', '.join(KINDS)}")
    if kind == "table":
        if table is None or len(table) != 2:
            raise ValueError(
                'kind="table" needs table=(k [h/Mpc], P [(Mpc/h)^3]) at a=1; see load_power_table'
            )
        _check_table(*table)
    elif table is not None:
        raise ValueError(f'table= is only used with kind="table", not kind={kind!r}')


def linear_power(
    k,
    cosmo: Cosmology,
    a=1.0,
    *,
    kind: str = "eisenstein_hu",
    table=None,
    growth_tab: GrowthTable | None = None,
):
    """Linear matter power spectrum P(k, a) [(Mpc/h)^3].

    k: wavenumber [h/Mpc], any shape, >= 0 (P = 0 at k <= 0, with zero gradient).
    a: scale factor (scalar or broadcastable with k); P scales as D1(a)^2.
    kind: "eisenstein_hu" (EH98 with BAO), "eisenstein_hu_nowiggle" (EH98
      smooth fit) -- both A k^n_s T(k)^2 --, "table", or "camb" (CAMB's
      linear spectrum for the cosmology, renormalised as a table is: see
      :mod:`distpm.boltzmann`).
    table: for kind="table", a pair (k [h/Mpc], P [(Mpc/h)^3]) at a = 1,
      interpolated linearly in log-log and extrapolated as power laws with the
      end slopes. The table is *renormalised* to ``cosmo.sigma8`` (its sigma8 is
      computed with :func:`sigma_R`): only its shape is used, so sigma8 stays
      a differentiable parameter; for a table already at cosmo.sigma8 this is a
      no-op (to the quadrature accuracy, ~1e-6). n_s is ignored for tables.
    growth_tab: optional precomputed :class:`GrowthTable` for D1(a); built
      from ``cosmo`` when needed.

    In every case sigma(8 Mpc/h, a=1) = cosmo.sigma8.
    """
    _validate(kind, table)
    pk = _power_today(k, cosmo, table, kind=kind)
    if isinstance(a, (int, float)) and a == 1.0:
        return pk
    if growth_tab is None:
        growth_tab = _table_for(a, cosmo)  # covers a concrete a > 2 too
    d1 = growth(a, growth_tab)[0]
    return d1**2 * pk


@functools.partial(jax.jit, static_argnames=("kind",))
def _power_today(k, cosmo: Cosmology, table, *, kind: str):
    """sigma8-normalised P(k, a=1), zero (with zero gradient) at k <= 0."""
    dtype = _dtype(cosmo, k)
    k = jnp.asarray(k, dtype)
    shape = _shape(kind, cosmo, table, dtype)
    # One evaluation of the spectrum on the sigma8 grid and the requested k together.
    grid = _log_grid(1e-5, 1e2, 4097)
    pos = k > 0
    kk = jnp.concatenate([jnp.asarray(grid, dtype), jnp.where(pos, k, 1.0).ravel()])
    vals = shape(kk)
    norm = (cosmo.sigma8 / _sigma_on_grid(8.0, grid, vals[: grid.size])) ** 2
    return jnp.where(pos, norm * vals[grid.size :].reshape(k.shape), 0.0)


def sigma8(cosmo: Cosmology, a=1.0, *, kind: str = "eisenstein_hu", table=None, R: float = 8.0):
    """sigma(R) [default R = 8 Mpc/h] of :func:`linear_power` at scale factor a."""
    return sigma_R(R, lambda k: linear_power(k, cosmo, a, kind=kind, table=table))


def load_power_table(path) -> tuple[np.ndarray, np.ndarray]:
    """Read a two-column text file ``k [h/Mpc]  P [(Mpc/h)^3]`` ('#' comments).

    Returns float64 numpy arrays (k, P). Raises ValueError if the file does not
    have two columns, or k is not strictly increasing, or k/P are not positive
    and finite.
    """
    path = Path(path)
    try:
        data = np.loadtxt(path, comments="#", ndmin=2, dtype=np.float64)
    except ValueError as err:
        raise ValueError(f"{path}: cannot parse as a two-column k, P table: {err}") from err
    if data.shape[1] != 2:
        raise ValueError(
            f"{path}: expected 2 columns (k [h/Mpc], P [(Mpc/h)^3]), got {data.shape[1]}"
        )
    k, pk = data[:, 0].copy(), data[:, 1].copy()
    try:
        _check_table(k, pk)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None
    return k, pk


@dataclasses.dataclass(frozen=True, eq=False)
class Spectrum:
    """A linear spectrum resolved once: its kind and, for a table, its (k, P) arrays.

    ``spectrum(k, cosmo, a)`` is :func:`linear_power` of that kind (P [(Mpc/h)^3]
    at k [h/Mpc] and scale factor a, normalised to ``cosmo.sigma8``). A run's
    initial conditions, its ``power.txt`` and plots, the Limber curves and the
    mass-function fits all take the one of :func:`resolved`.
    """

    kind: str = "eisenstein_hu"
    table: tuple[np.ndarray, np.ndarray] | None = None

    def __call__(self, k, cosmo: Cosmology, a=1.0, *, growth_tab: GrowthTable | None = None):
        return linear_power(k, cosmo, a, kind=self.kind, table=self.table, growth_tab=growth_tab)


@functools.lru_cache(maxsize=16)
def resolved(name: str) -> Spectrum:
    """The :class:`Spectrum` named by ``SimConfig.linear_power``: a fit's name
    ("eisenstein_hu", "eisenstein_hu_nowiggle"), "camb", or the path of a two-column table
    (:func:`load_power_table`), read once per process."""
    if name in NAMED:
        return Spectrum(name)
    if not Path(name).is_file():
        raise ValueError(f"linear_power must be one of {NAMED} or an existing file, got {name!r}")
    return Spectrum("table", load_power_table(name))


EISENSTEIN_HU = Spectrum()  # the default linear spectrum (EH98 with BAO)
