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

import matplotlib

matplotlib.use("Agg")
import healpy  # noqa: E402
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from distpm import halofit  # noqa: E402
from distpm.lightcone import spectra, tomography  # noqa: E402
from distpm.lightcone.config import LightconeConfig  # noqa: E402
from distpm.linear_power import resolved  # noqa: E402

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
        healpy.write_map(
            folder / "kappa_healpix.fits", [*kappa, counts], overwrite=True, dtype=np.float64,
            column_names=[f"KAPPA{i}" for i in range(len(sources))] + ["COUNTS"],
        )  # fmt: skip
        lmax = 3 * lc.nside - 1
        ell = np.arange(2, lmax + 1)
        curves["healpix"] = ell, [healpy.anafast(m, lmax=lmax)[2:] for m in kappa]
        fig = plt.figure(figsize=(8, 4 * len(sources)))
        for i, (m, s) in enumerate(zip(kappa, sources, strict=True)):
            healpy.mollview(m, fig=fig, sub=(len(sources), 1, i + 1), title=f"kappa, {_label(s)}")
        fig.savefig(folder / "kappa_healpix.png", dpi=100)
        plt.close(fig)
        shear_and_pairs("healpix", kappa)
    if "flat" in maps:
        kappa = np.asarray(maps["flat"], np.float64)
        np.save(folder / "kappa_flat.npy", kappa)
        np.save(folder / "counts_flat.npy", np.asarray(maps["flat_counts"]))
        measured_cl = [spectra.flat_power(m, lc.flat_fov) for m in kappa]
        curves["flat"] = measured_cl[0][0], [c[1] for c in measured_cl]
        fig, axes = plt.subplots(1, len(sources), figsize=(4.5 * len(sources), 4), squeeze=False)
        half = lc.flat_fov / 2
        for ax, m, s in zip(axes[0], kappa, sources, strict=True):
            image = ax.imshow(m.T, origin="lower", extent=(-half, half, -half, half), cmap="magma")
            ax.set_title(f"kappa, {_label(s)}")
            ax.set_xlabel("u [deg]")
            ax.set_ylabel("v [deg]")
            fig.colorbar(image, ax=ax, shrink=0.8)
        fig.tight_layout()
        fig.savefig(folder / "kappa_flat.png", dpi=100)
        plt.close(fig)
        shear_and_pairs("flat", kappa, lc.flat_fov)
    names = []
    fig, axes = plt.subplots(1, len(curves), figsize=(6 * len(curves), 4.5), squeeze=False)
    for ax, (kind, (ell, cls)) in zip(axes[0], curves.items(), strict=True):
        columns, nonlinear = [ell], []
        for cl, s in zip(cls, sources, strict=True):
            lin = spectra.limber(ell, p_lin, cosmo, s)
            nonlinear.append(spectra.limber(ell, p_halofit, cosmo, s))
            meas = (
                np.full_like(lin, np.nan)
                if p_meas is None
                else spectra.limber(ell, p_meas, cosmo, s)
            )
            columns += [cl, lin, meas]
            (line,) = ax.loglog(ell, cl, lw=1, label=f"distpm, {_label(s)}")
            ax.loglog(ell, lin, "--", color=line.get_color(), lw=1, label="Limber, linear P")
            ax.loglog(ell, nonlinear[-1], "-.", color=line.get_color(), lw=1,
                      label="Limber, halofit P")  # fmt: skip
            if p_meas is not None:
                ax.loglog(
                    ell, meas, ":", color=line.get_color(), lw=1.5, label="Limber, measured P"
                )
        ax.set_xlabel(r"$\ell$")
        ax.set_ylabel(r"$C_\ell^{\kappa\kappa}$")
        ax.set_title(f"{kind} map")
        ax.legend(fontsize=7)
        name = f"cl_{kind}.txt"
        table = np.column_stack(columns + nonlinear)  # halofit's after every source's three
        np.savetxt(folder / name, table, header=header, fmt="%.6e")
        names.append(f"{DIRECTORY}/{name}")
    fig.tight_layout()
    fig.savefig(folder / "cl.png", dpi=120)
    plt.close(fig)
    files = ["cl.png"]
    if "healpix" in maps:
        files += ["kappa_healpix.fits", "kappa_healpix.png"]
    if "flat" in maps:
        files += ["kappa_flat.npy", "counts_flat.npy", "kappa_flat.png"]
    return names + [f"{DIRECTORY}/{f}" for f in files + extra]
