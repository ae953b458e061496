"""Weak lensing against theory: full-sky Born convergence C_ell over Limber of the run's P(k, a).

The setting of ``tests/test_limber.py`` (128^3 particles in 512 Mpc/h,
fixed-amplitude initial conditions, 24 steps from a = 0.2, sources at
z_s = 1, HEALPix nside 512, one CPU device), for each of ``--seeds``: the
measured C_ell (healpy.anafast, divided by the bilinear painting window
:func:`distpm.lightcone.spectra.bilinear_window`) over the Limber integral of
the run's own P(k, a) (the particles' spectra at a = 0.5, 0.55, ..., 1 on a
mesh twice as fine; :func:`distpm.lightcone.spectra.limber`), binned in ell;
the run's time and its number of crossings. Writes results/limber.json, the
table in limber.md and results/limber.png.

    python benchmarks/limber.py            # ~8 min on 2 cores
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import time  # noqa: E402

import healpy  # noqa: E402
import matplotlib  # noqa: E402
import numpy as np  # noqa: E402
from scipy import integrate  # noqa: E402
from timing import HERE, measured_on, provenance, publish  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import distpm  # noqa: E402
from distpm.lightcone import LightconeConfig, lightcone, spectra  # noqa: E402

COSMO = distpm.Cosmology.planck18()
LOW, HIGH = (10, 20, 30, 45, 60, 80, 100, 130, 160, 200), (300, 400, 500, 600)


def ell_max(cfg, z_s):
    """The ell at which half of the Limber kernel (1 - chi/chi_s)^2 / a^2 (by its integral
    over chi) sees k = (ell + 1/2)/chi beyond k_Nyq/2 (the test's upper end)."""
    a = np.linspace(1 / (1 + z_s), 1.0, 4000)
    chi = spectra.distance_of_a(COSMO, a)
    kernel = (1 - chi / chi[0]) ** 2 / a**2
    k_half = 0.5 * np.pi * cfg.mesh_shape[0] / cfg.box_size[0]
    total = integrate.trapezoid(kernel, chi)
    for ell in range(2, HIGH[0]):
        beyond = integrate.trapezoid(np.where(chi < (ell + 0.5) / k_half, kernel, 0), chi)
        if beyond / total >= 0.5:
            return ell
    raise ValueError(f"k_Nyq/2 is reached beyond ell = {HIGH[0]}")


def realisation(seed, cfg, nside, z_s, lmax):
    """(C_ell measured and window-corrected, Limber of the measured P, Limber of the linear P,
    the run's seconds, crossings)."""
    lc = LightconeConfig(source_redshifts=(z_s,), nside=nside)
    t0 = time.perf_counter()
    maps, states = lightcone(distpm.white_noise(seed, cfg), COSMO, cfg, lc)
    kappa = np.asarray(maps["healpix"][0], np.float64)
    seconds = time.perf_counter() - t0
    fine = cfg.replace(mesh_shape=2 * cfg.mesh_shape[0])
    measured = [distpm.power_spectrum(distpm.density(s, fine), fine) for s in states]
    a = np.array([float(s.a) for s in states])
    k = np.asarray(measured[0][0], float)
    good = np.asarray(measured[0][2]) > 0
    pk = np.array([np.asarray(m[1], float)[good] for m in measured])
    ell = np.arange(2, lmax + 1)
    cl = healpy.anafast(kappa, lmax=lmax)[2:] / spectra.bilinear_window(nside, lmax)[2:]
    limber = spectra.limber(ell, spectra.measured_power(k[good], pk, a), COSMO, z_s)
    linear = spectra.limber(ell, lambda kk, aa: np.asarray(distpm.linear_power(kk, COSMO, aa)),
                            COSMO, z_s)  # fmt: skip
    crossings = float(np.sum(maps["healpix_counts"]))
    return ell, cl, limber, linear, seconds, crossings


def binned(ell, values, edges):
    """Mode-weighted means of ``values`` in the bins between ``edges``."""
    out = []
    for lo, hi in zip(edges[:-1], edges[1:], strict=True):
        sel = (ell >= lo) & (ell < hi)
        out.append(np.sum((2 * ell[sel] + 1) * values[sel]) / np.sum(2 * ell[sel] + 1))
    return np.array(out)


def plot(path, ell, cls, limbers, linear, seeds, edges, title):
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 7), sharex=True, height_ratios=(2, 1))
    mean_cl, mean_lim = np.mean(cls, axis=0), np.mean(limbers, axis=0)
    top.loglog(ell, mean_cl, lw=0.8, label=f"distpm Born, mean of {len(seeds)} runs")
    top.loglog(ell, mean_lim, "k--", lw=1.2, label="Limber, the runs' measured P(k, a)")
    top.loglog(ell, linear, ":", color="gray", lw=1.2, label="Limber, linear P(k, a)")
    top.set_ylabel(r"$C_\ell^{\kappa\kappa}$")
    top.legend(fontsize=8)
    top.set_title(title)
    centres = np.sqrt(np.array(edges[:-1]) * np.array(edges[1:]))
    for cl, lim, seed in zip(cls, limbers, seeds, strict=True):
        ratio = binned(ell, cl, edges) / binned(ell, lim, edges)
        bottom.semilogx(centres, ratio, "o", ms=3, label=f"seed {seed}")
    mean = binned(ell, mean_cl, edges) / binned(ell, mean_lim, edges)
    bottom.semilogx(centres, mean, "k-", label="mean")
    bottom.axhspan(0.95, 1.05, color="0.9")
    bottom.set_ylim(0.8, 1.3)
    bottom.set_xlabel(r"$\ell$")
    bottom.set_ylabel("C_ell / Limber")
    bottom.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run_arguments(description):
    """The options of the run this and ``tomography.py`` share (the setting of the tests)."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--box", type=float, default=512.0)
    ap.add_argument("--nside", type=int, default=512)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    return ap


def run_config(args):
    """The lightcone run: fixed amplitudes, 24 steps from a = 0.2, snapshots for P(k, a)."""
    return distpm.SimConfig(
        box_size=args.box,
        mesh_shape=args.n,
        a_start=0.2,
        n_steps=24,
        fixed_amplitude=True,
        snapshots=tuple(np.round(np.arange(0.5, 0.96, 0.05), 2)),
        parallel="1x1",
    )


def main():
    ap = run_arguments(__doc__.splitlines()[0])
    ap.add_argument("--z-source", type=float, default=1.0)
    args = ap.parse_args()
    cfg = run_config(args)
    top = ell_max(cfg, args.z_source)
    if not LOW[-1] < top < HIGH[0] - 1:
        raise SystemExit(f"ell_max = {top}: the bins are made for {LOW[-1]} < ell_max < {HIGH[0]}")
    edges = (*LOW, top + 1, *HIGH)
    runs = [realisation(s, cfg, args.nside, args.z_source, edges[-1]) for s in args.seeds]
    ell, linear = runs[0][0], runs[0][3]
    cls, limbers = [r[1] for r in runs], [r[2] for r in runs]
    ratios = [
        binned(ell, cl, edges) / binned(ell, lim, edges)
        for cl, lim in zip(cls, limbers, strict=True)
    ]
    mean = binned(ell, np.mean(cls, axis=0), edges) / binned(ell, np.mean(limbers, axis=0), edges)
    title = f"{args.n}$^3$ in {args.box:g} Mpc/h, $z_s$ = {args.z_source:g}, nside {args.nside}"
    plot(HERE / "results" / "limber.png", ell, cls, limbers, linear, args.seeds, edges, title)
    k_half = 0.5 * np.pi * args.n / args.box
    lines = [
        f"{args.n}^3 particles, {args.box:g} Mpc/h, z_s = {args.z_source:g}, nside {args.nside}, "
        f"one CPU device; k_Nyq/2 = {k_half:.3f} h/Mpc, ell_max = {top}. C_ell (window-corrected) "
        "over Limber of the run's measured P(k, a), mode-weighted per bin:",
        "",
        "| ell | " + " | ".join(f"seed {s}" for s in args.seeds) + " | mean of the runs |",
        "|---|" + "---|" * (len(args.seeds) + 1),
    ]
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        cells = " | ".join(f"{r[i]:.3f}" for r in ratios)
        lines.append(f"| {lo}-{hi - 1} | {cells} | {mean[i]:.3f} |")
    lines += [
        "",
        "Per run (steps included; the first run also compiles): "
        + "; ".join(
            f"seed {s}: {r[4]:.0f} s, {r[5]:.3g} crossings ({1e9 * r[4] / r[5]:.0f} ns each)"
            for s, r in zip(args.seeds, runs, strict=True)
        )
        + ". Plot: `results/limber.png`.",
        "",
        measured_on(provenance()),
    ]
    results = {
        "config": vars(args),
        "edges": list(edges),
        "ell_max": top,
        "ratios": {str(s): r.tolist() for s, r in zip(args.seeds, ratios, strict=True)},
        "mean_ratio": mean.tolist(),
        "run_s": [r[4] for r in runs],
        "crossings": [r[5] for r in runs],
        "provenance": provenance(),
    }
    publish(results, "\n".join(lines), "limber.json", "limber")


if __name__ == "__main__":
    main()
