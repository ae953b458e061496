"""Tomographic weak lensing against theory: the auto- and cross-spectra of two source planes
over Limber of the run's own P(k, a) and of halofit's.

The setting of ``tests/test_limber.py`` (128^3 particles in 512 Mpc/h, fixed-amplitude
initial conditions, 24 steps from a = 0.2, HEALPix nside 512, one CPU device) with source
planes at z_s = 0.5 and 1, for each of ``--seeds``. Per pair of planes, in bins of ell up to
that pair's ell_max (where half of its Limber kernel sees k beyond k_Nyq/2): the measured
C_ell (healpy.anafast, divided by the bilinear painting window) over

- Limber of the run's measured P(k, a) (particles' spectra at a = 0.5, 0.55, ..., 1 on a
  mesh twice as fine), which the tests hold to 5%;
- Limber of halofit's P(k, a) (Takahashi et al. 2012, the package's), where the run's own
  P(k, a) is within 5% of halofit's in Limber's weighting (the ratio of the two Limber
  integrals): there the measurement should be within 10% of halofit's Limber.

Writes results/tomography.json, the table in tomography.md and results/tomography.png.

    python benchmarks/tomography.py            # ~6 min on 2 cores
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402

import healpy  # noqa: E402
import numpy as np  # noqa: E402
from limber import run_arguments, run_config  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from scipy import integrate  # noqa: E402
from timing import HERE, measured_on, provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm import halofit  # noqa: E402
from distpm.lightcone import LightconeConfig, lightcone, spectra  # noqa: E402

COSMO = distpm.Cosmology.planck18()
SOURCES = (0.5, 1.0)
PAIRS = ((0, 0), (0, 1), (1, 1))
EDGES = (30, 45, 60, 80, 100, 130, 160, 200, 250, 300)


def ell_max(cfg, pair):
    """The ell at which half of the pair's Limber kernel sees k = (ell + 1/2)/chi > k_Nyq/2."""
    z_far = max(SOURCES[i] for i in pair)
    a = np.linspace(1 / (1 + z_far), 1.0, 4000)
    chi = spectra.distance_of_a(COSMO, a)
    g = [np.clip(1 - chi / spectra.distance_of_a(COSMO, np.array([1 / (1 + SOURCES[i])]))[0],
                 0, None) for i in pair]  # fmt: skip
    kernel = g[0] * g[1] / a**2
    k_half = 0.5 * np.pi * cfg.mesh_shape[0] / cfg.box_size[0]
    total = integrate.trapezoid(kernel, chi)
    for ell in range(2, 1000):
        beyond = integrate.trapezoid(np.where(chi < (ell + 0.5) / k_half, kernel, 0), chi)
        if beyond / total >= 0.5:  # (both negative: chi falls along a)
            return ell
    raise ValueError("k_Nyq/2 is reached beyond ell = 1000")


def realisation(seed, cfg, nside, lmax):
    """{pair: (C_ell window-corrected, Limber of measured P, Limber of halofit)}, seconds."""
    lc = LightconeConfig(source_redshifts=SOURCES, nside=nside)
    t0 = time.perf_counter()
    maps, states = lightcone(distpm.white_noise(seed, cfg), COSMO, cfg, lc)
    kappa = np.asarray(maps["healpix"], np.float64)
    seconds = time.perf_counter() - t0
    fine = cfg.replace(mesh_shape=2 * cfg.mesh_shape[0])
    measured = [distpm.power_spectrum(distpm.density(s, fine), fine) for s in states]
    a = np.array([float(s.a) for s in states])
    good = np.asarray(measured[0][2]) > 0
    k = np.asarray(measured[0][0], float)[good]
    p_run = spectra.measured_power(k, [np.asarray(m[1], float)[good] for m in measured], a)
    p_halofit = halofit.power_of_a(COSMO, 1 / (1 + max(SOURCES)))
    ell = np.arange(2, lmax + 1)
    window = spectra.bilinear_window(nside, lmax)[2:]
    out = {}
    for i, j in PAIRS:
        cl = healpy.anafast(kappa[i], kappa[j], lmax=lmax)[2:] / window
        theory = [spectra.limber(ell, p, COSMO, SOURCES[i], other=SOURCES[j])
                  for p in (p_run, p_halofit)]  # fmt: skip
        out[i, j] = (cl, *theory)
    return ell, out, seconds


def binned(ell, values, lo, hi):
    sel = (ell >= lo) & (ell < hi)
    return np.sum((2 * ell[sel] + 1) * values[sel]) / np.sum(2 * ell[sel] + 1)


def rows_of(ell, runs, cfg):
    """Per pair and bin: C/Limber(measured P), C/Limber(halofit), Limber(measured)/Limber(halofit)
    on the mean of the runs."""
    rows = []
    for pair in PAIRS:
        top = ell_max(cfg, pair)
        cl, lim_run, lim_hf = (np.mean([r[pair][n] for r in runs], axis=0) for n in range(3))
        edges = [e for e in EDGES if e < top] + [top + 1]
        for lo, hi in zip(edges[:-1], edges[1:], strict=True):
            c, m, h = (binned(ell, v, lo, hi) for v in (cl, lim_run, lim_hf))
            rows.append({
                "pair": [SOURCES[i] for i in pair], "ell": [lo, hi - 1],
                "over_measured": c / m, "over_halofit": c / h, "run_over_halofit": m / h,
            })  # fmt: skip
    return rows


def table(rows, cfg, args) -> str:
    lines = [
        f"{args.n}^3 particles, {args.box:g} Mpc/h, source planes z_s = {SOURCES}, nside "
        f"{args.nside}, mean of seeds {args.seeds}; per pair up to its ell_max. 'run / halofit': "
        "Limber of the run's P over Limber of halofit's; where it is within 5%, C_ell / "
        "halofit's Limber is held to 10% (the last column).",
        "",
        "| z_s pair | ell | C / Limber (run's P) | C / Limber (halofit) | run / halofit "
        "| within 10% of halofit |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        close = abs(r["run_over_halofit"] - 1) <= 0.05
        verdict = ("yes" if abs(r["over_halofit"] - 1) <= 0.10 else "NO") if close else "-"
        lines.append(
            f"| {r['pair'][0]} x {r['pair'][1]} | {r['ell'][0]}-{r['ell'][1]} | "
            f"{r['over_measured']:.3f} | {r['over_halofit']:.3f} | "
            f"{r['run_over_halofit']:.3f} | {verdict} |"
        )
    return "\n".join(lines)


def plot(path, ell, runs):
    fig = Figure(figsize=(12, 3.8))
    axes = fig.subplots(1, len(PAIRS))
    for ax, pair in zip(axes, PAIRS, strict=True):
        cl, lim_run, lim_hf = (np.mean([r[pair][n] for r in runs], axis=0) for n in range(3))
        ax.loglog(ell, cl, lw=0.8, label="distpm Born (mean)")
        ax.loglog(ell, lim_run, "k--", lw=1.2, label="Limber, run's P(k, a)")
        ax.loglog(ell, lim_hf, ":", color="C3", lw=1.5, label="Limber, halofit")
        ax.set_title(f"z_s {SOURCES[pair[0]]} x {SOURCES[pair[1]]}", fontsize=9)
        ax.set_xlabel(r"$\ell$")
    axes[0].set_ylabel(r"$C_\ell^{\kappa\kappa}$")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main():
    args = run_arguments(__doc__.splitlines()[0]).parse_args()
    cfg = run_config(args)
    runs, seconds = [], []
    for seed in args.seeds:
        ell, out, s = realisation(seed, cfg, args.nside, lmax=400)
        runs.append(out)
        seconds.append(s)
        print(f"seed {seed}: {s:.0f} s", flush=True)
    rows = rows_of(ell, runs, cfg)
    plot(HERE / "results" / "tomography.png", ell, runs)
    text = table(rows, cfg, args) + (
        f"\n\nRuns: {', '.join(f'{s:.0f} s' for s in seconds)}. Plot: `results/tomography.png`."
        f"\n\n{measured_on(provenance())}"
    )
    publish({"rows": rows, "seconds": seconds, "args": vars(args), **provenance()}, text,
            "tomography.json", "tomography")  # fmt: skip


if __name__ == "__main__":
    main()
