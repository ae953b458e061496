"""`distpm run` with two tomographic n(z) bins: kappa and shear maps per bin, the spectra of
every pair of bins with their Limber predictions, the plots, and the multipoles."""

import os
import subprocess
import sys

import numpy as np
from conftest import optional_import

healpy = optional_import("healpy")  # before distpm.lightcone, which needs it

from distpm.lightcone import shear  # noqa: E402

RUN_FILE = """
box_size = 400.0
mesh_shape = 16
a_start = 0.55
n_steps = 4
seed = 3
[output]
snapshot_format = "none"
multipoles = true
[lightcone]
nside = 8
nz_table = ["near.txt", "far.txt"]
"""


def test_two_nz_bins_give_maps_shear_and_every_pair_of_spectra(tmp_path):
    z = np.linspace(0.02, 0.8, 40)
    for name, centre in (("near.txt", 0.3), ("far.txt", 0.55)):
        np.savetxt(tmp_path / name, np.column_stack([z, np.exp(-0.5 * ((z - centre) / 0.08) ** 2)]))
    (tmp_path / "run.toml").write_text(RUN_FILE)
    result = subprocess.run(
        [sys.executable, "-m", "distpm.cli.main", "run", "run.toml", "--out", "out",
         "--no-progress", "--devices", "1x1"],
        cwd=tmp_path, capture_output=True, text=True, timeout=600,
        env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr
    folder = tmp_path / "out" / "lightcone"
    kappa = healpy.read_map(folder / "kappa_healpix.fits", field=None)
    assert kappa.shape == (3, 12 * 8**2)  # the two bins, then the crossing counts
    # lensing grows with the sources' distance: the far bin's map varies more
    assert np.std(kappa[1]) > 1.2 * np.std(kappa[0]) > 0
    sheared = healpy.read_map(folder / "shear_healpix.fits", field=None)
    for b in range(2):
        want = shear.healpix_shear(kappa[b])
        np.testing.assert_allclose(sheared[4 * b : 4 * b + 2], want, atol=1e-6 * np.std(want))
    pairs = np.loadtxt(folder / "cl_pairs_healpix.txt")
    assert pairs.shape == (3 * 8 - 2, 1 + 3 * 5)  # ell, then 5 columns for each of 3 pairs
    cross = healpy.anafast(kappa[0], kappa[1], lmax=23)[2:]
    np.testing.assert_allclose(pairs[:, 6], cross, rtol=1e-5, atol=1e-6 * np.abs(cross).max())
    for column in (4, 5, 9, 10, 14, 15):  # Limber of the measured and of halofit's P(k, a)
        assert np.all(pairs[:, column] > 0), column
    for name in ("cl.png", "cl_pairs_healpix.png", "shear_healpix.png", "kappa_healpix.png"):
        assert (folder / name).stat().st_size > 0
    multipoles = np.loadtxt(tmp_path / "out" / "multipoles.txt")
    assert multipoles.shape[1] == 11 and np.all(multipoles[:, 1] > 0)  # P0 > 0
    assert (tmp_path / "out" / "multipoles.png").stat().st_size > 0
