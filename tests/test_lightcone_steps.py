"""Few-step lightcones (issue 60): the 2LPT integrator's full-sky convergence C_ell at 10
and 5 steps against FastPM's at 40, from the same white noise.

The setting of ``test_limber.py`` (fixed-amplitude initial conditions from a = 0.2 in
512 Mpc/h, sources at z_s = 1) at 32^3 particles and nside 64; ``benchmarks/lightcone_steps.py``
makes the same comparison at 128^3 and nside 512 (0.08% and 0.41% up to ell = 248).
"""

import numpy as np
import pytest
from conftest import optional_import

healpy = optional_import("healpy")  # before distpm.lightcone, which needs it

import distpm  # noqa: E402
from distpm.lightcone import LightconeConfig, lightcone  # noqa: E402

# three runs whose lightcone work dominates (tests/conftest.py)
pytestmark = pytest.mark.full_optimization

COSMO = distpm.Cosmology.planck18()
BASE = distpm.SimConfig(
    box_size=512.0, mesh_shape=32, a_start=0.2, fixed_amplitude=True, parallel="1x1"
)
LC = LightconeConfig(source_redshifts=(1.0,), nside=64)
# benchmarks/limber.py's ell_max for 32^3 in 512 Mpc/h: half of the Limber kernel
# (1 - chi/chi_s)^2 / a^2 sees k = (ell + 1/2)/chi beyond k_Nyq/2 from ell = 62 on
ELL_MAX = 62
EDGES = (10, 20, 30, 45, ELL_MAX + 1)


def _binned_cl(integrator, steps):
    """The convergence C_ell, mode-weighted means in the bins between EDGES."""
    cfg = BASE.replace(integrator=integrator, n_steps=steps)
    maps, _ = lightcone(distpm.white_noise(1, cfg), COSMO, cfg, LC)
    cl = healpy.anafast(np.asarray(maps["healpix"][0], np.float64), lmax=ELL_MAX)
    ell = np.arange(ELL_MAX + 1)
    return np.array([
        np.average(cl[lo:hi], weights=2 * ell[lo:hi] + 1)
        for lo, hi in zip(EDGES[:-1], EDGES[1:], strict=True)
    ])  # fmt: skip


def test_2lpt_lightcone_in_few_steps_follows_fastpm_in_40():
    """Within 3% in every bin up to ELL_MAX at 10 steps, 5% at 5 (a piece of drift missed
    or seen twice would move C_ell by tens of per cent)."""
    reference = _binned_cl("fastpm", 40)
    for steps, tolerance in ((10, 0.03), (5, 0.05)):
        ratio = _binned_cl("2lpt", steps) / reference
        assert np.all(np.abs(ratio - 1) < tolerance), (steps, ratio)
