"""Weak lensing physics: the Born convergence of a simulation against Limber (issue 11).

Full-sky HEALPix maps of 128^3 particles in 512 Mpc/h (fixed-amplitude initial
conditions, sources at z_s = 1) are compared with the Limber integral of the
run's own measured P(k, a), computed here with numpy and scipy:

    C_ell = 9/4 Omega_m^2 (H0/c)^4 int_0^chi_s dchi (1 - chi/chi_s)^2 / a^2 P((ell + 1/2)/chi, a)

P(k, a) is measured from the particles at eleven times inside the lightcone
(a = 0.5, 0.55, ..., 1), on a mesh twice as fine as the run's (CIC window
divided out, no shot noise subtracted: the map holds the same particles'
discreteness), and is 0 outside the measured k range. The measured C_ell is
divided by the bilinear painting window of the pixels
(:func:`distpm.lightcone.spectra.bilinear_window`, 4% at ell = 248).
"""

import numpy as np
import pytest
from conftest import optional_import
from scipy import integrate

healpy = optional_import("healpy")  # before distpm.lightcone, which needs it

import distpm  # noqa: E402
from distpm.lightcone import LightconeConfig, lightcone, spectra  # noqa: E402

# two 128^3 runs of 24 steps: their runtime dominates (tests/conftest.py)
pytestmark = pytest.mark.full_optimization

COSMO = distpm.Cosmology.planck18()
C_OVER_H0 = 2997.92458  # [Mpc/h]
Z_S = 1.0
SOURCES = (0.5, Z_S)  # two source planes: their auto- and cross-spectra
NSIDE = 512
SEEDS = (1, 2)
RUN = distpm.SimConfig(
    box_size=512.0,
    mesh_shape=128,
    a_start=0.2,
    n_steps=24,
    fixed_amplitude=True,
    snapshots=tuple(np.round(np.arange(0.5, 0.96, 0.05), 2)),
    parallel="1x1",
)
EDGES = (30, 45, 60, 80, 100, 130, 160, 200)  # ell bins; the last one ends at ell_max


def _distance_table():
    """(a, chi [Mpc/h]) from a = 1/(1 + z_s) to 1: chi = c/H0 int_a^1 da' / (a'^2 E(a'))."""
    om = COSMO.Omega_m
    a = np.linspace(1.0 / (1.0 + max(SOURCES)), 1.0, 20001)
    integrand = 1.0 / (a * a * np.sqrt(om / a**3 + 1.0 - om))
    tail = integrate.cumulative_trapezoid(integrand[::-1], a[::-1], initial=0.0)[::-1]
    return a, -C_OVER_H0 * tail


def _measured_power(states):
    """P(k, a) [(Mpc/h)^3] of the particles: log P interpolated linearly in log k and in a."""
    fine = RUN.replace(mesh_shape=2 * RUN.mesh_shape[0])
    a_values, logs = [], []
    for state in states:
        delta = distpm.density(state, fine)
        k, p, n = (np.asarray(x, float) for x in distpm.power_spectrum(delta, fine))
        a_values.append(float(state.a))
        logs.append(np.log(p[n > 0]))
    logk, a_values, logs = np.log(k[n > 0]), np.array(a_values), np.array(logs)

    def power(k, a):  # 0 outside the measured k range
        log_k = np.log(k)
        per_a = np.stack([np.interp(log_k, logk, s) for s in logs])
        i = np.clip(np.searchsorted(a_values, a) - 1, 0, len(a_values) - 2)
        t = np.clip((a - a_values[i]) / (a_values[i + 1] - a_values[i]), 0.0, 1.0)
        lo, hi = (np.take_along_axis(per_a, j[None], 0)[0] for j in (i, i + 1))
        inside = (log_k >= logk[0]) & (log_k <= logk[-1])
        return np.where(inside, np.exp((1 - t) * lo + t * hi), 0.0)

    return power


def _limber(ell, power, pair=(Z_S, Z_S)):
    """Limber C_ell of the pair of source planes (the kernel (1 - chi/chi_1)(1 - chi/chi_2)
    / a^2 up to the nearer one), and the kernel."""
    a_grid, chi_grid = _distance_table()
    chi_1, chi_2 = (np.interp(1 / (1 + z), a_grid, chi_grid) for z in pair)
    chi = np.linspace(1.0, min(chi_1, chi_2), 4000)
    a = np.interp(chi, chi_grid[::-1], a_grid[::-1])
    kernel = (1 - chi / chi_1) * (1 - chi / chi_2) / a**2
    k = (np.asarray(ell, float)[:, None] + 0.5) / chi[None, :]
    p = power(k, np.broadcast_to(a, k.shape))
    cl = 2.25 * COSMO.Omega_m**2 / C_OVER_H0**4 * integrate.simpson(kernel * p, x=chi, axis=1)
    return cl, chi, kernel


def test_the_bilinear_window_falls_as_a_cic_window_of_one_pixel():
    """1 at ell = 0 and 1 - (ell side)^2 / 6 at small ell (side: the pixel's sqrt(area))."""
    for nside in (64, 512):
        w = spectra.bilinear_window(nside, 3 * nside)
        side = np.sqrt(4 * np.pi / (12 * nside**2))
        ell = np.arange(nside // 8)
        assert w[0] == 1.0 and np.all(np.diff(w) < 0)
        np.testing.assert_allclose(w[ell], 1 - (ell * side) ** 2 / 6, atol=1e-5)


PAIRS = ((1, 1), (0, 1), (0, 0))  # indices into SOURCES; the first is z_s = 1 alone


@pytest.fixture(scope="module")
def realisations():
    """{pair: (ell, [(measured C_ell, Limber C_ell) of each seed], kernel chi and weights)}
    (one device)."""
    lc = LightconeConfig(source_redshifts=SOURCES, nside=NSIDE)
    lmax = 400  # beyond ell_max
    ell = np.arange(lmax + 1)
    window = spectra.bilinear_window(NSIDE, lmax)[2:]
    out = {pair: [] for pair in PAIRS}
    for seed in SEEDS:
        maps, states = lightcone(distpm.white_noise(seed, RUN), COSMO, RUN, lc)
        kappa = np.asarray(maps["healpix"], np.float64)
        power = _measured_power(states)
        del maps, states
        for i, j in PAIRS:
            cl = healpy.anafast(kappa[i], kappa[j], lmax=lmax)
            limber, chi, kernel = _limber(ell[2:], power, (SOURCES[i], SOURCES[j]))
            out[i, j].append((cl[2:] / window, limber, chi, kernel))
    return ell[2:], out


def _binned_ratios(ell, runs, lowest=30):
    """The ratio of measured to Limber C_ell in bins of EDGES from ``lowest`` up to ell_max,
    the ell at which half of the Limber kernel sees k = (ell + 1/2)/chi > k_Nyq/2; and
    ell_max."""
    chi, kernel = runs[0][2:]
    k_half = 0.5 * np.pi * RUN.mesh_shape[0] / RUN.box_size[0]
    beyond = np.array([integrate.simpson(np.where((e + 0.5) / chi > k_half, kernel, 0), x=chi)
                       for e in ell]) / integrate.simpson(kernel, x=chi)  # fmt: skip
    ell_max = int(ell[np.argmax(beyond >= 0.5)])
    measured = np.mean([run[0] for run in runs], axis=0)
    limber = np.mean([run[1] for run in runs], axis=0)
    edges = [e for e in EDGES if lowest <= e < ell_max]
    ratios = []
    for lo, hi in zip(edges, (*edges[1:], ell_max + 1), strict=True):
        sel = (ell >= lo) & (ell < hi)
        modes = 2 * ell[sel] + 1
        ratios.append(np.sum(modes * measured[sel]) / np.sum(modes * limber[sel]))
    return np.array(ratios), ell_max


@pytest.mark.slow
def test_born_convergence_follows_limber_of_the_runs_own_power(realisations):
    """Binned C_ell within 5% of Limber for 30 <= ell <= ell_max, the ell at which half of
    the Limber kernel (1 - chi/chi_s)^2 / a^2 sees k = (ell + 1/2)/chi > k_Nyq/2."""
    ell, runs = realisations
    ratios, ell_max = _binned_ratios(ell, runs[1, 1])
    assert 200 < ell_max < 400 and len(ratios) == len(EDGES), ell_max
    np.testing.assert_allclose(ratios, 1.0, atol=0.05, err_msg=f"bins {EDGES}, ell_max {ell_max}")


@pytest.mark.slow
def test_tomographic_auto_and_cross_spectra_follow_limber(realisations):
    """The same for the source plane z_s = 0.5 and for its cross-spectrum with z_s = 1
    (kernel (1 - chi/chi_1)(1 - chi/chi_2) / a^2), each up to its own ell_max."""
    ell, runs = realisations
    for pair in ((0, 1), (0, 0)):
        ratios, ell_max = _binned_ratios(ell, runs[pair])
        assert ell_max > 100 and len(ratios) >= 4, (pair, ell_max)
        np.testing.assert_allclose(ratios, 1.0, atol=0.05, err_msg=f"{pair}, ell_max {ell_max}")
