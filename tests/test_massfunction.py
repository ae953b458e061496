"""Mass-function fits against colossus, and a PM run's halos against the Watson et al. fit."""

import numpy as np
import pytest
from conftest import optional_import

import distpm
from distpm.analysis import massfunction

# a 128^3 run of 10 steps and its halos: their runtime dominates (tests/conftest.py)
pytestmark = pytest.mark.full_optimization

COSMO = distpm.Cosmology.planck18()


def _colossus():
    cosmology = optional_import("colossus.cosmology.cosmology")

    c = cosmology.setCosmology(
        "distpm-mf", flat=True, H0=100 * COSMO.h, Om0=COSMO.Omega_m, Ob0=COSMO.Omega_b,
        sigma8=COSMO.sigma8, ns=COSMO.n_s, relspecies=False,
    )  # fmt: skip
    c.power_model = "eisenstein98"  # the spectrum distpm uses by default
    return c


@pytest.mark.parametrize("a", [1.0, 0.5])
def test_sigma_and_fits_equal_colossus(a):
    mass_function = optional_import("colossus.lss.mass_function")
    peaks = optional_import("colossus.lss.peaks")

    c, z = _colossus(), 1 / a - 1
    mass = np.geomspace(10.0, 1e5, 9)  # 1e11 .. 1e15 Msun/h
    msun = mass * 1e10
    sigma = c.sigma(peaks.lagrangianR(msun), z)
    np.testing.assert_allclose(massfunction.sigma_of_mass(mass, COSMO, a), sigma, rtol=1e-3)
    for ours, model in (
        (massfunction.watson_fof, "watson13"),
        (massfunction.sheth_tormen, "sheth99"),
        (massfunction.tinker_200m, "tinker08"),
    ):
        mdef = "200m" if model == "tinker08" else "fof"
        want = mass_function.massFunction(msun, z, mdef=mdef, model=model, q_out="dndlnM")
        np.testing.assert_allclose(ours(mass, COSMO, a), want, rtol=1.5e-2)


def test_measured_counts_per_volume_and_log_mass():
    masses = np.array([1.0, 1.5, 3.0, 3.5, 3.9, 12.0])
    centres, dndlnm, error, counts = massfunction.measured(masses, 10.0, [1.0, 2.0, 4.0, 8.0])
    assert list(counts) == [2, 3, 0]
    np.testing.assert_allclose(dndlnm, [2 / 10 / np.log(2), 3 / 10 / np.log(2), 0])
    np.testing.assert_allclose(error[:2], np.sqrt([2, 3]) / 10 / np.log(2))
    np.testing.assert_allclose(centres, [np.sqrt(2), np.sqrt(8), np.sqrt(32)])


def test_pm_halos_follow_the_watson_fit_above_100_particles():
    """128^3 particles in 256 Mpc/h, 10 steps, mesh = particle grid: FoF (b = 0.2) halos of
    >= 100 particles lie within 20% of Watson et al. (2013) in every bin (measured: 0.89 to
    1.06, Poisson errors 6% to 10%). Smaller halos are under-resolved by the PM force
    (20-40 particles: 0.72 of the fit), which is why the check starts at 100.

    Their M200m fall short of Tinker et al. (2008): 0.41 to 0.66 of the fit in the same
    bins (Poisson errors 7% to 13%). The PM force is smoothed over its 2 Mpc/h cells, while
    R200m of 100 particles is 1 Mpc/h: the halos' inner parts are too diffuse, so the mean
    density within a radius reaches 200 times the mean only further in. FoF, which links at
    about 80 times the mean density, sees the outskirts the PM resolves. (And 5-6% of the
    groups, merging ones whose centre of mass lies between their clumps, have M200m below
    a tenth of their FoF mass.)"""
    cfg = distpm.SimConfig(mesh_shape=128, box_size=256.0, a_start=0.1, n_steps=10, parallel=(1, 1))
    run = distpm.simulate(distpm.white_noise(0, cfg), COSMO, cfg)
    cat = distpm.halo_catalogue(run, distpm.fof(run, cfg), COSMO, cfg)
    particle = cat.mass[0] / cat.n[0]
    edges = particle * np.array([100, 141, 200, 283, 400, 1600])
    _, dndlnm, _, counts = massfunction.measured(cat.mass, 256.0**3, edges)
    fit = [
        np.mean(massfunction.watson_fof(np.geomspace(lo, hi, 9), COSMO, 1.0))
        for lo, hi in zip(edges[:-1], edges[1:], strict=True)
    ]
    assert counts.min() >= 80
    np.testing.assert_allclose(dndlnm / fit, 1.0, atol=0.2)
    _, dndlnm, _, counts = massfunction.measured(cat.m200m, 256.0**3, edges)
    fit = [
        np.mean(massfunction.tinker_200m(np.geomspace(lo, hi, 9), COSMO, 1.0))
        for lo, hi in zip(edges[:-1], edges[1:], strict=True)
    ]
    assert counts.min() >= 50
    assert np.all((dndlnm / fit > 0.3) & (dndlnm / fit < 0.8))
    assert np.all(cat.m200m <= 1.2 * cat.mass) and np.median(cat.m200m / cat.mass) > 0.5
