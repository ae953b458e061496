"""Halofit (Takahashi et al. 2012) against CAMB's, fed CAMB's own linear spectrum."""

import math

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import optional_import
from scipy.interpolate import CubicSpline

import distpm
from distpm import halofit
from distpm.background import Omega_m_of_a

COSMO = distpm.Cosmology.planck18()
REDSHIFTS = (0.0, 0.5, 1.0, 2.0, 3.0)


@pytest.fixture(scope="module", params=[(-1.0, 0.0), (-0.9, 0.3)], ids=["LCDM", "w0wa"])
def camb_spectra(request):
    """(cosmology, k [h/Mpc], z, linear P, CAMB's halofit P) at CAMB's own k nodes (float64),
    for Planck18 with w0, wa = ``request.param`` (CAMB's PPF dark energy)."""
    camb = optional_import("camb")
    cosmo = COSMO.replace(w0=request.param[0], wa=request.param[1])
    h = cosmo.h
    pars = camb.CAMBparams()
    pars.set_cosmology(
        H0=100 * h, ombh2=cosmo.Omega_b * h * h, omch2=cosmo.Omega_c * h * h, mnu=0.0
    )
    pars.set_dark_energy(w=cosmo.w0, wa=cosmo.wa, dark_energy_model="ppf")
    pars.InitPower.set_params(ns=cosmo.n_s, As=2.1e-9)
    pars.set_matter_power(redshifts=REDSHIFTS, kmax=200.0, nonlinear=True)
    pars.NonLinearModel.set_params(halofit_version="takahashi")
    results = camb.get_results(pars)
    k, z, p_lin = results.get_linear_matter_power_spectrum(hubble_units=True, k_hunit=True)
    _, _, p_nl = results.get_nonlinear_matter_power_spectrum(hubble_units=True, k_hunit=True)
    return cosmo, k, np.asarray(z), p_lin, p_nl


def _delta2_on(lnk, k_nodes, p_nodes):
    """Delta^2 on ``lnk`` of a spline through the nodes in ln k, ln P, straight beyond them."""
    x, y = np.log(k_nodes), np.log(p_nodes)
    spline = CubicSpline(x, y, bc_type="natural")
    inside = spline(np.clip(lnk, x[0], x[-1]))
    low = y[0] + (y[1] - y[0]) / (x[1] - x[0]) * (lnk - x[0])
    high = y[-1] + (y[-1] - y[-2]) / (x[-1] - x[-2]) * (lnk - x[-1])
    ln_p = np.where(lnk < x[0], low, np.where(lnk > x[-1], high, inside))
    return np.exp(3 * lnk + ln_p) / (2 * math.pi**2)


def test_halofit_equals_camb_to_1e3_up_to_k_10_and_z_3(camb_spectra, x64):
    """Given the same linear P(k, z), P_NL within 1e-3 of CAMB's at all its k <= 10 h/Mpc
    and z = 0 ... 3."""
    cosmo, k, zs, p_lin, p_nl = camb_spectra
    keep = k <= 10.0
    worst = 0.0
    for i, z in enumerate(zs):
        lnk = jnp.asarray(halofit.LNK)
        scales = halofit.scales(lnk, jnp.asarray(_delta2_on(halofit.LNK, k, p_lin[i])))
        a = 1.0 / (1.0 + z)
        om = float(Omega_m_of_a(jnp.asarray(a), cosmo))
        d2_lin = k[keep] ** 3 * p_lin[i, keep] / (2 * math.pi**2)
        w = cosmo.w0 + cosmo.wa * (1 - a)
        d2 = halofit.halofit_delta2(k[keep], d2_lin, *scales, om, 1 - om, w)
        ours = np.asarray(d2) * 2 * math.pi**2 / k[keep] ** 3
        ratio = ours / p_nl[i, keep]
        worst = max(worst, float(np.max(np.abs(ratio - 1))))
    assert worst < 1e-3, worst
    # the nonlinear correction itself is large there: the test can fail
    assert np.max(p_nl[0, keep] / p_lin[0, keep]) > 10


def test_halofit_is_linear_on_large_scales_and_grows_power_on_small(x64):
    """Of the package's own linear spectrum: P_L up to 0.005 h/Mpc, a little more at
    0.1 h/Mpc and over ten times more at 10 h/Mpc at a = 0.5."""
    k = jnp.asarray([1e-3, 5e-3, 0.1, 10.0])
    p_lin = np.asarray(distpm.linear_power(k, COSMO, 0.5))
    p_nl = np.asarray(halofit.nonlinear_power(k, COSMO, 0.5))
    np.testing.assert_array_equal(p_nl[:2], p_lin[:2])
    assert 1.002 < p_nl[2] / p_lin[2] < 1.05 and p_nl[3] / p_lin[3] > 10


def test_the_interpolated_power_of_a_equals_halofit_between_its_nodes():
    """power_of_a (for Limber integrals) against nonlinear_power at (k, a) off its nodes."""
    p = halofit.power_of_a(COSMO, 0.3)
    for a in (0.33, 0.61, 0.97):
        k = np.array([2e-3, 0.07, 0.9, 7.0])
        want = np.asarray(halofit.nonlinear_power(jnp.asarray(k), COSMO, a))
        np.testing.assert_allclose(p(k, np.full_like(k, a)), want, rtol=3e-3)
