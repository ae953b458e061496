"""Nonlinear matter power: the revised halofit of Takahashi et al. (2012).

Units: k [h/Mpc], P [(Mpc/h)^3], R [Mpc/h]. A fit to N-body spectra (Smith et
al. 2003, refitted by Takahashi et al. 2012, ApJ 761, 152; equation numbers
below are theirs) of the linear spectrum at the same time, for flat w0waCDM:

    Delta^2_NL(k) = Delta^2_Q(k) + Delta^2_H(k),   Delta^2(k) = k^3 P(k) / (2 pi^2),

with y = k / k_sigma, where the Gaussian-filtered variance of the linear
field sigma^2(R) = int dlnk Delta^2_L(k) exp(-k^2 R^2) is 1 at R = 1/k_sigma,
and the effective index n_eff = -3 - dln sigma^2/dlnR and curvature
C = -d^2 ln sigma^2 / dlnR^2 there (A4-A6). The coefficients (A6-A13) take
Omega_m(a), Omega_de(a) and w(a) = w0 + wa (1 - a) of the flat background
without radiation (:func:`distpm.background.Omega_m_of_a`), with the f1, f2,
f3 of Smith et al. interpolated in Omega_de as in CAMB's implementation.

At k <= 0.005 h/Mpc, P_NL = P_L (:data:`K_LINEAR`, as in CAMB). Pure JAX:
differentiable with respect to the cosmology through the linear spectrum and
the background (sigma(R) = 1 is solved by a fixed number of bisections and
Newton steps in ln R).
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np

from distpm.background import Omega_m_of_a
from distpm.cosmology import Cosmology
from distpm.linear_power import EISENSTEIN_HU, Spectrum

# ln k [h/Mpc] of the sigma(R) integrals: the Gaussian filter ends them at k R ~ 6, and
# sigma = 1 falls at R > 0.1 Mpc/h for any a <= 1 of a realistic cosmology
LNK = np.linspace(math.log(1e-5), math.log(1e3), 4096)
K_LINEAR = 0.005  # [h/Mpc] P_NL = P_L at k <= K_LINEAR


def _moments(ln_r, lnk, delta2):
    """(ln sigma^2, dln sigma^2/dlnR, d^2ln sigma^2/dlnR^2) at R = exp(ln_r), Gaussian filter,
    by the trapezoid rule over ``lnk`` of Delta^2_L."""
    x2 = jnp.exp(2 * (lnk + ln_r))
    w = delta2 * jnp.exp(-x2)
    s1, s2, s3 = (jnp.trapezoid(f, lnk) for f in (w, x2 * w, x2 * (1 - x2) * w))
    d1 = -2 * s2 / s1
    return jnp.log(s1), d1, -d1 * d1 - 4 * s3 / s1


def scales(lnk, delta2):
    """(k_sigma [h/Mpc], n_eff, C) of a linear Delta^2 (``delta2`` at ``lnk``), or k_sigma = 0
    where sigma(R) < 1 at every R the grid resolves (the field is linear: P_NL = P_L)."""
    lo, hi = jnp.asarray(-lnk[-1] + 2.0, delta2.dtype), jnp.asarray(-lnk[0], delta2.dtype)
    linear = _moments(lo, lnk, delta2)[0] < 0

    def bisect(_, bounds):
        lo, hi = bounds
        mid = 0.5 * (lo + hi)
        above = _moments(mid, lnk, delta2)[0] > 0  # sigma > 1: R is below the root
        return jnp.where(above, mid, lo), jnp.where(above, hi, mid)

    lo, hi = jax.lax.fori_loop(0, 40, bisect, (lo, hi))

    def newton(_, ln_r):
        ln_s2, d1, _ = _moments(ln_r, lnk, delta2)
        return ln_r - ln_s2 / d1

    ln_r = jax.lax.fori_loop(0, 3, newton, 0.5 * (lo + hi))
    _, d1, d2 = _moments(ln_r, lnk, delta2)
    return jnp.where(linear, 0.0, jnp.exp(-ln_r)), -3.0 - d1, -d2


def _f123(om, ode):
    """Smith et al.'s f1, f2, f3 (A13), between their open (Omega_de = 0) and flat forms by
    the share of Omega_de in 1 - Omega_m, as CAMB does."""
    open_ = (om**-0.0732, om**-0.1423, om**0.0725)
    flat = (om**-0.0307, om**-0.0585, om**0.0743)
    share = ode / jnp.where(jnp.abs(1 - om) > 1e-6, 1 - om, 1.0)
    return [share * b + (1 - share) * a for a, b in zip(open_, flat, strict=True)]


def halofit_delta2(k, delta2_lin, k_sigma, n, c, om, ode, w):
    """Delta^2_NL at k [h/Mpc] of Delta^2_L ``delta2_lin`` there (A1-A3, A6-A13), given the
    scales of :func:`scales` and Omega_m, Omega_de and w at that time."""
    log_a = (1.5222 + 2.8553 * n + 2.3706 * n**2 + 0.9903 * n**3 + 0.2250 * n**4
             - 0.6038 * c + 0.1749 * ode * (1 + w))  # fmt: skip
    log_b = -0.5642 + 0.5864 * n + 0.5716 * n**2 - 1.5474 * c + 0.2279 * ode * (1 + w)
    log_c = 0.3698 + 2.0404 * n + 0.8161 * n**2 + 0.5869 * c
    gamma = 0.1971 - 0.0843 * n + 0.8460 * c
    alpha = jnp.abs(6.0835 + 1.3373 * n - 0.1959 * n**2 - 5.5274 * c)
    beta = 2.0379 - 0.7354 * n + 0.3157 * n**2 + 1.2490 * n**3 + 0.3980 * n**4 - 0.1682 * c
    nu = 10.0 ** (5.2105 + 3.6902 * n)  # mu = 0
    f1, f2, f3 = _f123(om, ode)
    y = k / jnp.where(k_sigma > 0, k_sigma, 1.0)
    quasi_linear = delta2_lin * (1 + delta2_lin) ** beta / (1 + alpha * delta2_lin)
    quasi_linear *= jnp.exp(-y / 4 - y * y / 8)
    halo = 10.0**log_a * y ** (3 * f1)
    halo /= 1 + 10.0**log_b * y**f2 + (f3 * 10.0**log_c * y) ** (3 - gamma)
    halo /= 1 + nu / (y * y)
    # below K_LINEAR the fit's quasi-linear term is off by up to 0.3% where the true spectrum
    # is linear to 1e-4: linear there, as CAMB's halofit does
    return jnp.where((k_sigma > 0) & (k > K_LINEAR), quasi_linear + halo, delta2_lin)


def nonlinear_power(k, cosmo: Cosmology, a=1.0, *, spectrum: Spectrum = EISENSTEIN_HU):
    """Halofit P_NL(k, a) [(Mpc/h)^3] at k [h/Mpc] (any shape, > 0) and a scalar scale
    factor a, of the linear ``spectrum`` (a run's: ``linear_power.resolved(cfg.linear_power)``;
    default Eisenstein-Hu) with ``cosmo``'s background."""
    k = jnp.asarray(k)
    lnk = jnp.asarray(LNK, k.dtype if jnp.issubdtype(k.dtype, jnp.floating) else None)
    grid = jnp.exp(lnk)
    delta2 = grid**3 * spectrum(grid, cosmo, a) / (2 * math.pi**2)
    k_sigma, n, c = scales(lnk, delta2)
    om = Omega_m_of_a(jnp.asarray(a, delta2.dtype), cosmo)
    w = cosmo.w0 + cosmo.wa * (1 - a)
    d2_lin = k**3 * spectrum(k, cosmo, a) / (2 * math.pi**2)
    d2 = halofit_delta2(k, d2_lin, k_sigma, n, c, om, 1 - om, w)
    return d2 * 2 * math.pi**2 / k**3


def power_of_a(cosmo: Cosmology, a_min: float, *, spectrum: Spectrum = EISENSTEIN_HU, n_a=24):
    """A function p(k, a) of arrays (any matching shapes; k [h/Mpc], a_min <= a <= 1) giving
    halofit's P_NL [(Mpc/h)^3]: the linear spectrum times halofit's P_NL / P_L, computed at
    ``n_a`` scale factors and 256 wavenumbers and interpolated (linearly in a and ln k), as
    Limber integrals over the lightcone need it at every distance."""
    from scipy.interpolate import RegularGridInterpolator

    k_nodes = np.geomspace(1e-4, 1e2, 256)
    a_nodes = np.linspace(a_min, 1.0, n_a)
    boost = np.asarray(_boosts(k_nodes, cosmo, jnp.asarray(a_nodes), spectrum=spectrum))
    ratio = RegularGridInterpolator((a_nodes, np.log(k_nodes)), boost)

    def p(k, a):
        k, a = np.broadcast_arrays(np.asarray(k, np.float64), np.asarray(a, np.float64))
        ln_k = np.clip(np.log(k), math.log(k_nodes[0]), math.log(k_nodes[-1]))
        points = np.stack([np.clip(a, a_nodes[0], 1.0), ln_k], axis=-1)
        return np.asarray(spectrum(k, cosmo, a)) * ratio(points)

    return p


@functools.partial(jax.jit, static_argnames="spectrum")
def _boosts(k, cosmo, a, *, spectrum):
    """P_NL / P_L at wavenumbers k for each scale factor of ``a`` (n_a, n_k)."""

    def boost(a):
        return nonlinear_power(k, cosmo, a, spectrum=spectrum) / spectrum(k, cosmo, a)

    return jax.vmap(boost)(a)
