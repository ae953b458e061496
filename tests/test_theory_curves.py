"""The theory beside a run's measurements is that of the run's own linear spectrum: a run from
a table draws its linear, halofit and Limber curves and its mass function from the table."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REFERENCE
from scipy import integrate, interpolate
from test_lightcone import COSMO, _distpm_run, _limber_linear

import distpm

# halofit's reference Limber integral calls it about 900 times: its runtime dominates
pytestmark = pytest.mark.full_optimization


def test_a_run_from_a_table_draws_every_theory_curve_from_it(tmp_path):
    """``linear_power`` = a table that differs from Eisenstein-Hu by a bump f(k): power.txt's
    linear column, the Limber column of the C_ell table and the mass function's sigma(M) are
    those of the table (normalised to sigma8 here, by scipy), not Eisenstein-Hu's."""

    from distpm.analysis import massfunction
    from distpm.linear_power import resolved

    ref = np.loadtxt(REFERENCE / "eh98_planck18_z0.txt")
    k_tab = ref[:, 0]
    bump = lambda k: 1.0 + 0.5 * np.exp(-(np.log(k / 0.05) ** 2))  # noqa: E731
    table = tmp_path / "bumped.txt"
    np.savetxt(table, np.column_stack([k_tab, ref[:, 3] * bump(k_tab)]))

    def p_table(k):  # log-log interpolation, power laws beyond the ends
        return np.exp(np.interp(np.log(k), np.log(k_tab), np.log(ref[:, 3] * bump(k_tab))))

    def sigma(radius, scale=1.0):
        def integrand(lnk):
            k = np.exp(lnk)
            x = k * radius
            w = 3 * (np.sin(x) - x * np.cos(x)) / x**3
            return k**3 * scale * p_table(k) * w**2 / (2 * np.pi**2)

        return np.sqrt(integrate.quad(integrand, np.log(1e-4), np.log(10.0), limit=400)[0])

    scale = (COSMO.sigma8 / sigma(8.0)) ** 2  # the table's shape at the cosmology's sigma8
    growth = np.loadtxt(REFERENCE / "growth_planck18.txt")  # colossus's D1 at 11 a
    d1 = interpolate.CubicSpline(np.log(growth[:, 0]), growth[:, 1])  # of ln a
    d1_of_a = lambda a: float(d1(np.log(a)))  # noqa: E731
    out = tmp_path / "out"
    sets = [
        "box_size=400.0", "mesh_shape=16", "a_start=0.4", "n_steps=2", "seed=4",
        f'linear_power="{table}"', 'output.snapshot_format="none"',
        "lightcone.source_redshifts=[0.6]", "lightcone.nside=8",
    ]  # fmt: skip
    _distpm_run(out, sets, "1x1")
    k, p_lin = np.loadtxt(out / "power.txt")[:, [0, 3]].T
    np.testing.assert_allclose(p_lin, scale * p_table(k), rtol=2e-3)
    eh = np.asarray(distpm.linear_power(k, COSMO))
    assert np.max(np.abs(p_lin / eh - 1)) > 0.2  # the bump shows: not Eisenstein-Hu's
    cl = np.loadtxt(out / "lightcone" / "cl_healpix.txt")
    picks = [0, 10, 21]
    want = _limber_linear(cl[picks, 0], 0.6, lambda k, a: d1_of_a(a) ** 2 * scale * p_table(k))
    np.testing.assert_allclose(cl[picks, 2], want, rtol=2e-3)
    # halofit's Limber, after the source's three columns: of the table's halofit too
    from distpm import halofit

    nonlinear = jax.jit(halofit.nonlinear_power, static_argnames="spectrum")
    spectrum = resolved(str(table))

    def p_halofit(k, a):
        return float(nonlinear(jnp.asarray([k]), COSMO, a, spectrum=spectrum)[0])

    want = _limber_linear(cl[picks, 0], 0.6, p_halofit)
    np.testing.assert_allclose(cl[picks, 4], want, rtol=3e-3)
    assert np.max(np.abs(cl[:, 4] / cl[:, 2] - 1)) > 5e-3  # not the linear column again
    mass = 1e5  # [1e10 Msun/h]: R = 14 Mpc/h, where the bump adds 4% to sigma
    radius = np.cbrt(3 * mass / (4 * np.pi * massfunction.mean_density(COSMO)))
    got = massfunction.sigma_of_mass(mass, COSMO, spectrum=resolved(str(table)))
    np.testing.assert_allclose(got, sigma(radius, scale), rtol=1e-3)
    assert abs(massfunction.sigma_of_mass(mass, COSMO) / got - 1) > 0.03
