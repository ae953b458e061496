"""What ``distpm run`` writes for a lightcone: maps, their C_ell, the Limber predictions, images.

Files (in ``<out>/lightcone/``):
- ``kappa_healpix.fits``: one column per source, then the crossing counts
  (RING order, healpy.write_map); ``kappa_flat.npy``: (n_sources, P, P) and
  ``counts_flat.npy``: (P, P);
- ``cl_healpix.txt`` / ``cl_flat.txt``: ell, then per source the measured
  C_ell, the Limber C_ell of the run's linear P(k) and of its measured P(k, a);
- ``cl.png``: those spectra; ``kappa_healpix.png``, ``kappa_flat.png``: the maps;
- the shear maps and the spectra of every pair of sources
  (:mod:`distpm.lightcone.tomography`).
"""

from __future__ import annotations

import healpy
import numpy as np

from distpm import halofit, plots
from distpm.io import partial
from distpm.lightcone import spectra, tomography
from distpm.lightcone.config import LightconeConfig
from distpm.linear_power import resolved

DIRECTORY = "lightcone"


def _sources(lc: LightconeConfig) -> list:
    return [*lc.source_redshifts, *lc.distributions]


def _label(source) -> str:
    return f"z_s = {source:g}" if isinstance(source, float) else f"n(z) to z = {source.z_max:g}"


def write_lightcone(out, maps, measured, cosmo, cfg, lc: LightconeConfig) -> list[str]:
    """Write the maps, spectra and plots; return the names written (relative to ``out``).

    maps: as :func:`distpm.lightcone.lightcone` returns them (numpy).
    measured: (a (n_a,), k (n_k,), P (n_a, n_k)) the run's P(k) at several a,
    or None (then no nonlinear Limber curve).
    """
    folder = out / DIRECTORY
    folder.mkdir(parents=True, exist_ok=True)
    sources = _sources(lc)

    spectrum = resolved(cfg.linear_power)  # the one the initial conditions used

    def p_lin(k, a):
        return np.asarray(spectrum(np.asarray(k), cosmo, np.asarray(a)))

    p_meas = (
        None if measured is None else spectra.measured_power(measured[1], measured[2], measured[0])
    )
    header = "ell  " + "  ".join(
        f"[{_label(s)}] C_ell  C_ell_Limber_linear  C_ell_Limber_measured_P" for s in sources
    )
    header += "  " + "  ".join(f"[{_label(s)}] C_ell_Limber_halofit" for s in sources)
    p_halofit = halofit.power_of_a(cosmo, 1.0 / (1.0 + lc.z_max), spectrum=spectrum)
    curves, extra = {}, []
    labels = [_label(s) for s in sources]

    def shear_and_pairs(kind, kappa, fov=None):
        names, modes = tomography.write_shear(folder, kind, kappa, fov)
        ell, measured = tomography.pair_spectra(kind, kappa, modes, fov)
        names += tomography.write_pairs(
            folder, kind, ell, measured, sources, labels, cosmo, p_meas, p_halofit
        )
        extra.extend(names)

    if "healpix" in maps:
        kappa = np.asarray(maps["healpix"], np.float64)
        counts = np.asarray(maps["healpix_counts"], np.float64)
        with partial.writing(folder / "kappa_healpix.fits") as temporary:
            healpy.write_map(
                temporary, [*kappa, counts], overwrite=True, dtype=np.float64,
                column_names=[f"KAPPA{i}" for i in range(len(sources))] + ["COUNTS"],
            )  # fmt: skip
        lmax = 3 * lc.nside - 1
        ell = np.arange(2, lmax + 1)
        curves["healpix"] = ell, [healpy.anafast(m, lmax=lmax)[2:] for m in kappa]
        titles = [f"kappa, {label}" for label in labels]
        plots.save(plots.sky_maps(kappa, titles), folder / "kappa_healpix.png", dpi=100)
        shear_and_pairs("healpix", kappa)
    if "flat" in maps:
        kappa = np.asarray(maps["flat"], np.float64)
        for name, x in (("kappa_flat.npy", kappa), ("counts_flat.npy", maps["flat_counts"])):
            with partial.opened(folder / name) as f:
                np.save(f, np.asarray(x))
        measured_cl = [spectra.flat_power(m, lc.flat_fov) for m in kappa]
        curves["flat"] = measured_cl[0][0], [c[1] for c in measured_cl]
        figure = plots.flat_maps(kappa, lc.flat_fov, [f"kappa, {label}" for label in labels])
        plots.save(figure, folder / "kappa_flat.png", dpi=100)
        shear_and_pairs("flat", kappa, lc.flat_fov)
    names, panels = [], {}
    for kind, (ell, cls) in curves.items():
        columns, nonlinear, panels[kind] = [ell], [], (ell, [])
        for cl, s in zip(cls, sources, strict=True):
            lin = spectra.limber(ell, p_lin, cosmo, s)
            nonlinear.append(spectra.limber(ell, p_halofit, cosmo, s))
            meas = None if p_meas is None else spectra.limber(ell, p_meas, cosmo, s)
            columns += [cl, lin, np.full_like(lin, np.nan) if meas is None else meas]
            panels[kind][1].append((_label(s), cl, lin, nonlinear[-1], meas))
        name = f"cl_{kind}.txt"
        table = np.column_stack(columns + nonlinear)  # halofit's after every source's three
        with partial.opened(folder / name) as f:
            np.savetxt(f, table, header=header, fmt="%.6e")
        names.append(f"{DIRECTORY}/{name}")
    plots.save(plots.convergence_spectra_plot(panels), folder / "cl.png")
    files = ["cl.png"]
    if "healpix" in maps:
        files += ["kappa_healpix.fits", "kappa_healpix.png"]
    if "flat" in maps:
        files += ["kappa_flat.npy", "counts_flat.npy", "kappa_flat.png"]
    return names + [f"{DIRECTORY}/{f}" for f in files + extra]
