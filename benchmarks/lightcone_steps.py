"""Few-step lightcones: the 2LPT integrator's convergence C_ell against a 40-step FastPM run.

The setting of ``benchmarks/limber.py`` (128^3 particles in 512 Mpc/h, fixed-amplitude
initial conditions from a = 0.2, sources at z_s = 1, HEALPix nside 512, one CPU device),
one white noise: the full-sky Born convergence of the 2LPT integrator at 10 and 5 steps
(and, for comparison, of FastPM at as many) over that of FastPM at 40 steps, C_ell per
ell bin (mode-weighted means, healpy.anafast) up to the ell_max that limber.py validates
against Limber (half of the lensing kernel within k_Nyq/2), and beyond it. Writes
results/lightcone_steps.json, the table in lightcone_steps.md and
results/lightcone_steps.png.

    python benchmarks/lightcone_steps.py            # ~15 min on 2 cores
    python benchmarks/lightcone_steps.py --n 64 --nside 128   # quick check
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import time  # noqa: E402

import healpy  # noqa: E402
import matplotlib  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
from limber import HIGH, LOW, binned, ell_max, run_arguments  # noqa: E402
from timing import HERE, measured_on, provenance, publish  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

import distpm  # noqa: E402
from distpm.lightcone import LightconeConfig, lightcone  # noqa: E402

COSMO = distpm.Cosmology.planck18()
REFERENCE = ("fastpm", 40)
RUNS = (("2lpt", 10), ("2lpt", 5), ("fastpm", 10), ("fastpm", 5))
GOAL = {10: 0.03, 5: 0.05}  # issue 60: |C_ell / reference - 1| up to ell_max, 2LPT integrator


def kappa_cl(cfg, seed, nside, z_s, lmax):
    """(C_ell for ell = 2 .. lmax, the run's seconds) of the Born convergence of one run."""
    lc = LightconeConfig(source_redshifts=(z_s,), nside=nside)
    t0 = time.perf_counter()
    maps, _ = lightcone(distpm.white_noise(seed, cfg), COSMO, cfg, lc)
    kappa = np.asarray(maps["healpix"][0], np.float64)
    return healpy.anafast(kappa, lmax=lmax)[2:], time.perf_counter() - t0


def plot(path, edges, ratios, top, title):
    fig, ax = plt.subplots(figsize=(7, 4))
    centres = np.sqrt(np.array(edges[:-1]) * np.array(edges[1:]))
    for (integrator, steps), ratio in ratios.items():
        style = "o-" if integrator == "2lpt" else "s:"
        ax.semilogx(centres, ratio, style, ms=4, label=f"{integrator}, {steps} steps")
    ax.axhspan(0.97, 1.03, color="0.9", label="3%")
    ax.axvline(top, color="k", lw=0.8, ls="--", label=f"ell_max = {top}")
    ax.set_xticks([10, 20, 50, 100, 200, 500], ["10", "20", "50", "100", "200", "500"])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel(r"$\ell$")
    ax.set_ylabel(r"$C_\ell^{\kappa\kappa}$ / FastPM, 40 steps")
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main():
    ap = run_arguments(__doc__.splitlines()[0])
    ap.add_argument("--z-source", type=float, default=1.0)
    args = ap.parse_args()
    seed = args.seeds[0]
    base = distpm.SimConfig(
        box_size=args.box, mesh_shape=args.n, a_start=0.2, fixed_amplitude=True, parallel="1x1"
    )
    top = ell_max(base, args.z_source)
    edges = tuple(sorted({*LOW, top + 1, *HIGH}))  # a bin ends at ell_max
    ell = np.arange(2, edges[-1] + 1)
    cls, seconds = {}, {}
    for integrator, steps in (REFERENCE, *RUNS):
        cfg = base.replace(integrator=integrator, n_steps=steps)
        cl, s = kappa_cl(cfg, seed, args.nside, args.z_source, edges[-1])
        cls[integrator, steps], seconds[integrator, steps] = binned(ell, cl, edges), s
        print(f"{integrator} {steps} steps: {s:.0f} s", flush=True)
    ratios = {run: cls[run] / cls[REFERENCE] for run in RUNS}
    below = np.array(edges[1:]) <= top + 1  # the bins up to ell_max
    worst = {run: float(np.max(np.abs(r[below] - 1))) for run, r in ratios.items()}
    title = f"{args.n}$^3$ in {args.box:g} Mpc/h, $z_s$ = {args.z_source:g}, nside {args.nside}"
    plot(HERE / "results" / "lightcone_steps.png", edges, ratios, top, title)
    names = [f"{i}, {s} steps" for i, s in RUNS]
    lines = [
        f"{args.n}^3 particles, {args.box:g} Mpc/h, fixed amplitudes from a = 0.2, seed {seed}, "
        f"z_s = {args.z_source:g}, nside {args.nside}, one CPU device; ell_max = {top}. "
        "Born convergence C_ell over that of FastPM at 40 steps (the same noise), "
        "mode-weighted per bin:",
        "",
        "| ell | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(RUNS),
    ]
    for i, (lo, hi) in enumerate(zip(edges[:-1], edges[1:], strict=True)):
        lines.append(f"| {lo}-{hi - 1} | " + " | ".join(f"{ratios[r][i]:.4f}" for r in RUNS) + " |")
    lines += [
        "| largest \\|ratio - 1\\| up to ell_max | "
        + " | ".join(f"{100 * worst[r]:.2f}%" for r in RUNS)
        + " |",
        "| run [s] (compile included) | " + " | ".join(f"{seconds[r]:.0f}" for r in RUNS) + " |",
        "",
        f"Goal (issue 60): the 2LPT integrator within {100 * GOAL[10]:g}% at 10 steps and "
        f"{100 * GOAL[5]:g}% at 5, up to ell_max. The reference took {seconds[REFERENCE]:.0f} s. "
        "Plot: `results/lightcone_steps.png`.",
        "",
        measured_on(provenance(), "one CPU device"),
    ]
    results = {
        "config": vars(args),
        "edges": list(edges),
        "ell_max": top,
        "ratios": {f"{i}_{s}": r.tolist() for (i, s), r in ratios.items()},
        "worst_up_to_ell_max": {f"{i}_{s}": w for (i, s), w in worst.items()},
        "run_s": {f"{i}_{s}": t for (i, s), t in seconds.items()},
        "provenance": provenance(),
    }
    publish(results, "\n".join(lines), "lightcone_steps.json", "lightcone_steps")


if __name__ == "__main__":
    main()
