"""Lightcone crossings: distances, each step's Chebyshev series and the crossing solve against
scipy's quadrature and root finding (float64 references)."""

import jax
import jax.numpy as jnp
import numpy as np
from conftest import optional_import
from lcdm import chi_of_a as _chi
from lcdm import growth_of_a as _growth
from scipy import optimize

import distpm
from distpm import background
from distpm.lightcone import LightconeConfig, record
from distpm.lightcone.crossing import _evaluate, _series, crossing

COSMO = distpm.Cosmology.planck18()
CFG32 = distpm.SimConfig(box_size=300.0, mesh_shape=8, a_start=0.5, n_steps=4, parallel="1x1")


def _shells(cfg, lc, cosmo=COSMO):
    return record.tables(cosmo, cfg, lc)


def test_comoving_distance_matches_quadrature_and_colossus(x64):
    cosmology = optional_import("colossus.cosmology.cosmology")

    table = background.distance_table(COSMO)
    a = np.array([0.99, 0.7, 0.5, 0.25, 0.05])
    got = np.asarray(background.comoving_distance(a, table))
    np.testing.assert_allclose(got, [_chi(x) for x in a], rtol=1e-9)
    col = cosmology.setCosmology(
        "distpm-test",
        dict(flat=True, H0=100 * COSMO.h, Om0=COSMO.Omega_m, Ob0=COSMO.Omega_b,
             sigma8=COSMO.sigma8, ns=COSMO.n_s, relspecies=False),
    )  # fmt: skip
    np.testing.assert_allclose(got, col.comovingDistance(0.0, 1 / a - 1), rtol=1e-6)
    assert np.isnan(float(background.comoving_distance(1e-4, table)))  # below the table


def test_crossings_lie_on_the_lightcone():
    """|r(a_cross)| = chi(a_cross) to 1e-3 cell in float32, against scipy's chi and D."""
    lc = LightconeConfig(source_redshifts=(0.9,), nside=8)
    shells, tab = _shells(CFG32, lc)
    rng = np.random.default_rng(2)
    n, i = 4000, 1
    a0, a1, d0, d1, c0, c1 = np.asarray(shells[i], np.float64)
    r_mid = rng.uniform(c1, c0, n)  # start points around the shell, moving a few Mpc/h
    x0 = rng.normal(size=(n, 3))
    x0 *= (r_mid / np.linalg.norm(x0, axis=1))[:, None]
    dx = rng.normal(0, 5, (n, 3))
    hit, a, r = crossing(jnp.asarray(x0, jnp.float32), jnp.asarray(dx, jnp.float32),
                                shells[i], tab)  # fmt: skip
    hit, a, r = (np.asarray(v, np.float64) for v in (hit, a, r))
    hit = hit.astype(bool)
    assert hit.sum() > 0.8 * n
    cell = CFG32.cell_size[0]
    chi_at = np.array([_chi(x) for x in a[hit]])
    assert np.max(np.abs(np.linalg.norm(r[hit], axis=1) - chi_at)) < 1e-3 * cell
    # and the crossing point lies on the particle's trajectory at D(a_cross)
    t = (np.array([_growth(x) for x in a[hit]]) - d0) / (d1 - d0)
    np.testing.assert_allclose(r[hit], x0[hit] + t[:, None] * dx[hit], atol=1e-3 * cell)
    # a scipy root of the same equation, for a few particles
    for k in np.flatnonzero(hit)[:5]:

        def fun(x, k=k):
            return np.linalg.norm(x0[k] + (_growth(x) - d0) / (d1 - d0) * dx[k]) - _chi(x)

        np.testing.assert_allclose(a[k], optimize.brentq(fun, a0, a1, xtol=1e-12), atol=2e-6)


def test_the_steps_chebyshev_series_equal_the_tables(x64):
    """D(a) and chi(a) of each step's series (which the crossing solve uses) equal the tables
    to 1e-8 (float64) across the steps of runs from a = 0.1, 0.2 and 0.5; the slopes too."""
    cosmo = jax.tree.map(jnp.float64, COSMO)
    for a_start, n_steps in ((0.1, 10), (0.2, 24), (0.5, 4)):
        cfg = distpm.SimConfig(
            box_size=300.0,
            mesh_shape=8,
            a_start=a_start,
            n_steps=n_steps,
            dtype="float64",
            parallel="1x1",
        )
        lc = LightconeConfig(source_redshifts=(1 / a_start - 1,), nside=8)
        shells, tab = _shells(cfg, lc, cosmo)
        s = jnp.linspace(-1.0, 1.0, 101)
        for shell in shells:
            d, d_s, chi, chi_s = _evaluate(_series(shell, tab), s)
            log_ratio = jnp.log(shell[1] / shell[0])
            a = shell[0] * jnp.exp(0.5 * (s + 1) * log_ratio)
            d_true, f_true = background.growth(a, tab["growth"])[:2]
            chi_true = background.comoving_distance(a, tab["dist"])
            np.testing.assert_allclose(d, d_true, rtol=1e-8)
            np.testing.assert_allclose(chi, chi_true, rtol=1e-8, atol=1e-8)
            # d/ds = (dX/dln a) (ln a1 - ln a0) / 2
            np.testing.assert_allclose(d_s, f_true * d_true * log_ratio / 2, rtol=1e-6)
            light = -background.C_OVER_H0 / (a * background.E(a, cosmo)) * log_ratio / 2
            np.testing.assert_allclose(chi_s, light, rtol=1e-6)
