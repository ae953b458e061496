"""Flat LCDM by scipy quadrature (float64): the independent reference of the lightcone tests."""

import numpy as np
from scipy import integrate

import distpm
from distpm.units import C_OVER_H0 as C

COSMO = distpm.Cosmology.planck18()


def chi_of_a(a, cosmo=COSMO):
    """[Mpc/h] comoving distance by scipy quadrature (float64)."""
    om = cosmo.Omega_m

    def inv(x):
        return 1.0 / (x * x * np.sqrt(om / x**3 + 1 - om))

    return C * integrate.quad(inv, a, 1.0, epsabs=0, epsrel=1e-12)[0]


def growth_of_a(a, cosmo=COSMO):
    """Linear growth of flat LCDM, D ~ H int da / (a H)^3, normalised to D(1) = 1."""
    om = cosmo.Omega_m

    def d(x):
        e = np.sqrt(om / x**3 + 1 - om)
        return e * integrate.quad(lambda y: (y * np.sqrt(om / y**3 + 1 - om)) ** -3, 0, x)[0]

    return d(a) / d(1.0)
