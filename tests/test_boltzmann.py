"""linear_power = "camb": CAMB's own linear spectrum, renormalised to sigma8, with gradients
through sigma8 and the growth only; a run records it."""

import json

import jax
import numpy as np
from conftest import optional_import
from scipy import integrate

camb = optional_import("camb")

import distpm  # noqa: E402
from distpm import pipeline  # noqa: E402

COSMO = distpm.Cosmology.planck18()


def _sigma8(results):
    """sigma8 of CAMB's linear spectrum by scipy's quad (CAMB's own get_sigma8_0 is 2e-4 below
    this converged integral for Planck18)."""
    interp = results.get_matter_power_interpolator(nonlinear=False, extrap_kmax=1e3)

    def integrand(lnk):
        k = np.exp(lnk)
        x = 8.0 * k
        window = 3 * (np.sin(x) - x * np.cos(x)) / x**3
        return k**3 * interp.P(0.0, k) * window**2 / (2 * np.pi**2)

    return np.sqrt(integrate.quad(integrand, np.log(3e-5), np.log(1e2), limit=2000)[0])


def _cambs_own(cosmo, k_min, k_max, n):
    """CAMB run here with the same parameters: (k, P renormalised to cosmo.sigma8)."""
    h = cosmo.h
    pars = camb.CAMBparams()
    pars.set_cosmology(H0=100 * h, ombh2=cosmo.Omega_b * h * h, omch2=cosmo.Omega_c * h * h,
                       mnu=0.0, num_massive_neutrinos=0, TCMB=cosmo.T_cmb)  # fmt: skip
    pars.set_dark_energy(w=cosmo.w0, wa=cosmo.wa, dark_energy_model="ppf")
    pars.InitPower.set_params(ns=cosmo.n_s, As=2.1e-9)
    pars.set_matter_power(redshifts=[0.0], kmax=100.0)
    results = camb.get_results(pars)
    k, _, p = results.get_matter_power_spectrum(minkh=k_min, maxkh=k_max, npoints=n)
    return k, p[0] * (cosmo.sigma8 / _sigma8(results)) ** 2


def test_camb_spectrum_is_cambs_own_at_1e4():
    for cosmo in (COSMO, COSMO.replace(w0=-0.9, wa=0.3, sigma8=0.75)):
        k, want = _cambs_own(cosmo, 1e-3, 10.0, 300)
        got = np.asarray(distpm.linear_power(k, cosmo, kind="camb"))
        np.testing.assert_allclose(got, want, rtol=1e-4)


def test_camb_spectrum_gradients_flow_through_sigma8_and_growth_only():
    def p_of(cosmo, a):
        return distpm.linear_power(0.1, cosmo, a, kind="camb")

    today = jax.jit(jax.grad(p_of), static_argnums=1)(COSMO, 1.0)
    p = float(p_of(COSMO, 1.0))
    np.testing.assert_allclose(float(today.sigma8), 2 * p / COSMO.sigma8, rtol=1e-5)
    assert float(today.Omega_c) == 0.0 and float(today.n_s) == 0.0  # the shape has none
    earlier = jax.grad(p_of)(COSMO, 0.5)
    assert float(earlier.Omega_c) != 0.0  # through D(a)


def test_a_run_with_cambs_spectrum_uses_and_records_it(tmp_path):
    cfg = distpm.SimConfig(box_size=128.0, mesh_shape=16, n_steps=2, linear_power="camb")
    output = pipeline.OutputConfig(snapshot_format="none")
    summary = pipeline.run(cfg, COSMO, tmp_path, output=output, progress=False)
    assert summary["versions"]["camb"] == camb.__version__
    assert json.loads((tmp_path / "summary.json").read_text())["config"]["linear_power"] == "camb"
    table = np.loadtxt(tmp_path / "power.txt")
    want = np.asarray(distpm.linear_power(table[:, 0], COSMO, 1.0, kind="camb"))
    np.testing.assert_allclose(table[:, 3], want, rtol=1e-5)
