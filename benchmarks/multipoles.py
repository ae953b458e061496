"""Redshift-space multipoles of a run against Kaiser's prediction, bin by bin.

``--n``^3 particles in ``--box`` Mpc/h, 10 steps from a = 0.1 to 1, fixed-amplitude initial
conditions (random phases), one CPU device; the final particles moved to redshift space along
z (plane-parallel), painted, and their P0 and P2 binned as ``distpm run`` writes them. Against
Kaiser's (1 + 2f/3 + f^2/5) P and (4f/3 + 4f^2/7) P of the linear P(k) and of halofit's, the
mean over ``--seeds`` (the phases), with the Gaussian error of that mean per bin. Linear
theory holds on the largest scales; beyond, the pairwise velocities (fingers of God) lower
P2 below Kaiser, which the table shows where. Writes results/multipoles.json and the table in
multipoles.md.

    python benchmarks/multipoles.py            # ~15 s on 2 cores
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402

import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from timing import measured_on, provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm import halofit  # noqa: E402
from distpm.analysis.power import multipoles  # noqa: E402
from distpm.analysis.redshift import kaiser, redshift_space  # noqa: E402

COSMO = distpm.Cosmology.planck18()


def measure(cfg, seed):
    """(k, P0, P2, modes) of the final particles in redshift space along z."""
    final = distpm.simulate(distpm.white_noise(seed, cfg), COSMO, cfg)
    delta = distpm.density(redshift_space(final, COSMO, cfg, axis=2), cfg)
    k, p, modes = multipoles(delta, cfg, axis=2, ells=(0, 2))
    return np.asarray(k), np.asarray(p[0]), np.asarray(p[1]), np.asarray(modes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--box", type=float, default=1024.0)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4])
    ap.add_argument("--bins", type=int, default=10, help="the first bins shown")
    args = ap.parse_args()
    cfg = distpm.SimConfig(
        box_size=args.box, mesh_shape=args.n, n_steps=10, fixed_amplitude=True, parallel="1x1"
    )
    runs = [measure(cfg, seed) for seed in args.seeds]
    k, modes = runs[0][0], runs[0][3]
    p0, p2 = (np.mean([r[i] for r in runs], axis=0) for i in (1, 2))
    f = float(distpm.growth_rate(1.0, COSMO))
    lin = np.asarray(distpm.linear_power(jnp.asarray(k), COSMO, 1.0))
    hf = np.asarray(halofit.nonlinear_power(jnp.asarray(k), COSMO, 1.0))
    # Gaussian errors of a bin's estimate from m modes (Kaiser's P(k, mu)), over the seeds
    sigma0 = kaiser(lin, f, 0) * np.sqrt(2 / np.maximum(modes, 1) / len(runs))
    rows = []
    lines = [
        f"{args.n}^3 particles, {args.box:g} Mpc/h, 10 steps, fixed amplitudes, mean of "
        f"{len(runs)} phases; line of sight z; f = {f:.4f}. Kaiser of the linear P and of "
        "halofit's; sigma: the Gaussian error of the mean P0 over its Kaiser value.",
        "",
        "| k [h/Mpc] | modes | P0 / Kaiser(lin) | P2 / Kaiser(lin) | P0 / Kaiser(halofit) "
        "| P2 / Kaiser(halofit) | sigma(P0) |",
        "|---|---|---|---|---|---|---|",
    ]
    for i in range(min(args.bins, len(k))):
        if modes[i] == 0:
            continue
        row = {
            "k": float(k[i]), "modes": int(modes[i]),
            "p0_lin": float(p0[i] / kaiser(lin[i], f, 0)),
            "p2_lin": float(p2[i] / kaiser(lin[i], f, 2)),
            "p0_halofit": float(p0[i] / kaiser(hf[i], f, 0)),
            "p2_halofit": float(p2[i] / kaiser(hf[i], f, 2)),
            "sigma_p0": float(sigma0[i] / kaiser(lin[i], f, 0)),
        }  # fmt: skip
        rows.append(row)
        lines.append(
            f"| {row['k']:.4f} | {row['modes']} | {row['p0_lin']:.3f} | {row['p2_lin']:.3f} | "
            f"{row['p0_halofit']:.3f} | {row['p2_halofit']:.3f} | {row['sigma_p0']:.3f} |"
        )
    p = provenance()
    lines += ["", measured_on(p)]
    publish({"rows": rows, "f": f, "args": vars(args), **p}, "\n".join(lines),
            "multipoles.json", "multipoles")  # fmt: skip


if __name__ == "__main__":
    main()
