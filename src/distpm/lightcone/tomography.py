"""Shear maps and the spectra of every pair of sources, as ``distpm run`` writes them.

Files (in ``<out>/lightcone/``, beside the convergence's):
- ``shear_healpix.fits``: per source, gamma1, gamma2 and the reduced shear
  g1, g2 (RING, healpy.write_map), to ell = 3 nside - 1;
  ``shear_healpix.png``: |gamma| per source (Mollweide);
- ``shear_flat.npy``: (n_sources, 4, P, P): gamma1, gamma2, g1, g2;
  ``shear_flat.png``: kappa with the shear drawn as whiskers;
- ``cl_pairs_healpix.txt`` / ``cl_pairs_flat.txt``: ell, then for every pair
  i <= j of sources the measured C_ell of kappa, of the shear's E and B
  modes, and Limber's kappa C_ell of the run's measured P(k, a) and of
  halofit's (the shear's E-mode prediction is kappa's times
  (l + 2)(l - 1) / (l (l + 1)) on the sphere, kappa's on the flat field);
  ``cl_pairs_healpix.png`` / ``cl_pairs_flat.png``: one panel per pair.
See :mod:`distpm.lightcone.shear` for the conventions.
"""

from __future__ import annotations

import itertools

import healpy
import numpy as np

from distpm import plots
from distpm.io import partial
from distpm.lightcone import shear, spectra


def write_shear(folder, kind, kappa, fov_deg=None) -> tuple[list[str], list]:
    """The shear maps of convergence maps (n_sources, ...) of ``kind``; (names, (E, B) of
    each source's shear: harmonic coefficients on the sphere, maps on the flat field)."""
    if kind == "healpix":
        gammas = [shear.healpix_shear(k) for k in kappa]
        columns, names = [], []
        for i, (k, (g1, g2)) in enumerate(zip(kappa, gammas, strict=True)):
            columns += [g1, g2, shear.reduced(g1, k), shear.reduced(g2, k)]
            names += [f"GAMMA1_{i}", f"GAMMA2_{i}", f"G1_{i}", f"G2_{i}"]
        with partial.writing(folder / "shear_healpix.fits") as temporary:
            healpy.write_map(temporary, columns, overwrite=True, dtype=np.float64,
                             column_names=names)  # fmt: skip
        sizes = [np.hypot(g1, g2) for g1, g2 in gammas]
        titles = [f"|gamma|, source {i}" for i in range(len(kappa))]
        plots.save(plots.sky_maps(sizes, titles), folder / "shear_healpix.png", dpi=100)
        modes = [shear.healpix_modes(g1, g2) for g1, g2 in gammas]
        return ["shear_healpix.fits", "shear_healpix.png"], modes
    g1, g2 = (np.asarray(g, np.float64) for g in shear.flat_shear(np.asarray(kappa)))
    maps = np.stack([g1, g2, shear.reduced(g1, kappa), shear.reduced(g2, kappa)], axis=1)
    with partial.opened(folder / "shear_flat.npy") as f:
        np.save(f, maps)
    titles = [f"kappa and shear, source {i}" for i in range(len(kappa))]
    figure = plots.flat_maps(kappa, fov_deg, titles, shear=(g1, g2))
    plots.save(figure, folder / "shear_flat.png", dpi=100)
    modes = [
        tuple(np.asarray(m) for m in shear.flat_modes(a, b)) for a, b in zip(g1, g2, strict=True)
    ]
    return ["shear_flat.npy", "shear_flat.png"], modes


def pair_spectra(kind, kappa, modes, fov_deg=None):
    """(ell, {(i, j): (C_kappa, C_E, C_B)}) measured for every pair i <= j of sources."""
    out = {}
    pairs = itertools.combinations_with_replacement(range(len(kappa)), 2)
    if kind == "healpix":
        lmax = 3 * healpy.npix2nside(kappa.shape[-1]) - 1
        alms = [healpy.map2alm(np.asarray(k, np.float64), lmax=lmax, iter=3) for k in kappa]
        for i, j in pairs:
            e, b = (healpy.alm2cl(modes[i][m], modes[j][m]) for m in (0, 1))
            out[i, j] = tuple(x[2:] for x in (healpy.alm2cl(alms[i], alms[j]), e, b))
        return np.arange(2, lmax + 1), out
    for i, j in pairs:
        fields = [(kappa[i], kappa[j]), (modes[i][0], modes[j][0]), (modes[i][1], modes[j][1])]
        cl = [spectra.flat_power(a, fov_deg, other=b) for a, b in fields]
        out[i, j] = tuple(c[1] for c in cl)
    return cl[0][0], out


def write_pairs(folder, kind, ell, measured, sources, labels, cosmo, p_meas, p_halofit):
    """``cl_pairs_{kind}.txt`` and its figure, one panel per pair; the names written."""
    columns, header, panels = [ell], "ell", []
    for (i, j), (kk, ee, bb) in measured.items():
        theory = [
            np.full(len(ell), np.nan)
            if p is None
            else spectra.limber(ell, p, cosmo, sources[i], other=sources[j])
            for p in (p_meas, p_halofit)
        ]
        columns += [kk, ee, bb, *theory]
        header += (f"  [{labels[i]} x {labels[j]}] C_kappa C_E C_B Limber_measured_P "
                   "Limber_halofit")  # fmt: skip
        panels.append((f"{kind}: {labels[i]} x {labels[j]}", kk, ee, bb, *theory))
    plots.save(plots.pair_spectra_plot(ell, panels), folder / f"cl_pairs_{kind}.png", dpi=100)
    name = f"cl_pairs_{kind}.txt"
    with partial.opened(folder / name) as f:
        np.savetxt(f, np.column_stack(columns), header=header, fmt="%.6e")
    return [name, f"cl_pairs_{kind}.png"]
