"""Halo mass functions: the measured one of a catalogue, and fits to compare it with.

dn/dlnM [(h/Mpc)^3] = f(sigma) (rho_m / M) |dln sigma / dln M|, with sigma(M, a)
the RMS linear density contrast in top-hat spheres of mass M (radius
(3 M / (4 pi rho_m))^(1/3)), from distpm's linear P(k) at the scale factor a.
Masses in 1e10 Msun/h, rho_m = Omega_m rho_crit in 1e10 Msun/h per (Mpc/h)^3.

- Watson et al. (2013, MNRAS 433, 1230), their universal FoF (b = 0.2) fit:
  f = A ((beta / sigma)^alpha + 1) exp(-gamma / sigma^2), A = 0.282,
  alpha = 2.163, beta = 1.406, gamma = 1.210.
- Tinker et al. (2008, ApJ 688, 709), for M200m (Delta = 200 times the mean density):
  f = A ((sigma / b)^-a + 1) exp(-c / sigma^2), A = 0.186 (1 + z)^-0.14,
  a = 1.47 (1 + z)^-0.06, b = 2.57 (1 + z)^-alpha, c = 1.19,
  log10 alpha = -(0.75 / log10(200 / 75))^1.2.
- Sheth & Tormen (1999, MNRAS 308, 119): f = A sqrt(2 a / pi) (1 + (a nu^2)^-p)
  nu exp(-a nu^2 / 2), nu = delta_c / sigma, A = 0.3222, a = 0.707, p = 0.3,
  delta_c = 1.686.

Host numpy (float64): these are small tables for plots and checks.
"""

from __future__ import annotations

import math

import numpy as np

from distpm.linear_power import EISENSTEIN_HU, Spectrum, sigma_R
from distpm.units import critical_density

DELTA_C = 1.686


def mean_density(cosmo) -> float:
    """[1e10 Msun/h per (Mpc/h)^3] comoving mean matter density Omega_m rho_crit."""
    return float(cosmo.Omega_m) * critical_density()


def sigma_of_mass(mass, cosmo, a=1.0, *, spectrum: Spectrum = EISENSTEIN_HU) -> np.ndarray:
    """sigma(M, a) of masses [1e10 Msun/h] (any shape) for the linear ``spectrum``
    (a run's: ``distpm.linear_power.resolved(cfg.linear_power)``; default Eisenstein-Hu)."""
    mass = np.asarray(mass, np.float64)
    radius = np.cbrt(3.0 * mass / (4.0 * math.pi * mean_density(cosmo)))
    sigma = sigma_R(radius.ravel(), lambda k: np.asarray(spectrum(k, cosmo, a)))
    return np.asarray(sigma, np.float64).reshape(mass.shape)


def _dn_dlnm(mass, cosmo, a, f_of_sigma, spectrum):
    mass = np.asarray(mass, np.float64)
    step = 1e-3  # centred difference in ln M
    lo, mid, hi = (
        sigma_of_mass(mass * math.exp(s), cosmo, a, spectrum=spectrum) for s in (-step, 0.0, step)
    )
    slope = np.abs(np.log(hi / lo) / (2 * step))
    return f_of_sigma(mid) * mean_density(cosmo) / mass * slope


def watson_fof(mass, cosmo, a=1.0, *, spectrum: Spectrum = EISENSTEIN_HU) -> np.ndarray:
    """dn/dlnM [(h/Mpc)^3] of the Watson et al. (2013) FoF fit at masses [1e10 Msun/h],
    for the linear ``spectrum`` (see :func:`sigma_of_mass`)."""

    def f(sigma):
        return 0.282 * ((1.406 / sigma) ** 2.163 + 1.0) * np.exp(-1.210 / sigma**2)

    return _dn_dlnm(mass, cosmo, a, f, spectrum)


def tinker_200m(mass, cosmo, a=1.0, *, spectrum: Spectrum = EISENSTEIN_HU) -> np.ndarray:
    """dn/dlnM [(h/Mpc)^3] of the Tinker et al. (2008) fit for M200m at masses [1e10 Msun/h],
    for the linear ``spectrum`` (see :func:`sigma_of_mass`)."""
    z = 1.0 / a - 1.0
    alpha = 10 ** (-((0.75 / math.log10(200.0 / 75.0)) ** 1.2))
    big_a, small_a = 0.186 * (1 + z) ** -0.14, 1.47 * (1 + z) ** -0.06
    b, c = 2.57 * (1 + z) ** -alpha, 1.19

    def f(sigma):
        return big_a * ((sigma / b) ** -small_a + 1.0) * np.exp(-c / sigma**2)

    return _dn_dlnm(mass, cosmo, a, f, spectrum)


def sheth_tormen(mass, cosmo, a=1.0, *, spectrum: Spectrum = EISENSTEIN_HU) -> np.ndarray:
    """dn/dlnM [(h/Mpc)^3] of the Sheth & Tormen (1999) fit at masses [1e10 Msun/h],
    for the linear ``spectrum`` (see :func:`sigma_of_mass`)."""

    def f(sigma):
        nu = DELTA_C / sigma
        big_a, small_a, p = 0.3222, 0.707, 0.3
        return (
            big_a
            * math.sqrt(2 * small_a / math.pi)
            * (1 + (small_a * nu**2) ** -p)
            * nu
            * np.exp(-small_a * nu**2 / 2)
        )

    return _dn_dlnm(mass, cosmo, a, f, spectrum)


def measured(masses, volume, edges):
    """Measured dn/dlnM [(h/Mpc)^3] in mass bins, with Poisson errors.

    masses [1e10 Msun/h]; volume [(Mpc/h)^3]; edges: bin edges [1e10 Msun/h].
    Returns (centres (geometric), dn/dlnM, error, counts).
    """
    edges = np.asarray(edges, np.float64)
    counts, _ = np.histogram(masses, bins=edges)
    width = np.diff(np.log(edges))
    centres = np.sqrt(edges[1:] * edges[:-1])
    return centres, counts / volume / width, np.sqrt(counts) / volume / width, counts
