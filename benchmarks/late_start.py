"""Where five steps go: the 2LPT integrator started later, from 3LPT initial conditions.

For 128^3 particles in 256 Mpc/h on a mesh of the same size (CIC, Planck18, float32, one CPU
device), the 2LPT integrator from a_start = 0.1, 0.2 and 0.3 with 2LPT and 3LPT initial
conditions, at 3, 5, 10 and 20 steps: P/P_ref and r at k_Nyq/8, k_Nyq/4 and k_Nyq/2 of
the particle grid against the converged reference of ``few_steps.py`` (from a = 0.1, 2LPT,
mesh 4x, 40 FastPM steps), and P against the same mesh's 40-step FastPM run (whose own mesh
error the steps cannot remove). Later starts spend the steps where the field is nonlinear;
they need the third order, whose error at the start is smaller than 2LPT's.

    python benchmarks/late_start.py      # about 8 min on 2 cores
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402

from accuracy import FRACTIONS, evolve_timed, row  # noqa: E402
from timing import measured_on, provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm.analysis import convergence  # noqa: E402

KEYS = ["a_start", "lpt_order", "steps"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--steps", type=int, nargs="+", default=[3, 5, 10, 20])
    ap.add_argument("--starts", type=float, nargs="+", default=[0.1, 0.2, 0.3])
    args = ap.parse_args()
    base = distpm.SimConfig(box_size=256.0, mesh_shape=args.size, parallel="1x1")
    noise = distpm.white_noise(0, base)
    ref_cfg = convergence.reference_config(base)
    reference = evolve_timed(noise, ref_cfg)[0]
    same_cfg = base.replace(n_steps=40)
    same = evolve_timed(noise, same_cfg)[0]
    table = []
    for a_start in args.starts:
        for order in (2, 3):
            for steps in args.steps:
                cfg = base.replace(
                    integrator="2lpt", a_start=a_start, lpt_order=order, n_steps=steps
                )
                final, per_step = evolve_timed(noise, cfg)
                result = convergence.compare(final, cfg, reference, ref_cfg)
                settings = dict(zip(KEYS, (a_start, order, steps), strict=True))
                table.append(row(result, **settings, s_per_step=per_step))
                table[-1]["dev_quarter"] = result.worst(result.k_nyquist / 4)[0]
                mesh = convergence.compare(final, cfg, same, same_cfg)
                table[-1]["ratio_same_mesh"] = [
                    float(mesh.ratio[mesh.at(mesh.k_nyquist / f)]) for f in FRACTIONS
                ]
                table[-1]["dev_half_same_mesh"] = mesh.worst(mesh.k_nyquist / 2)[0]
                print(table[-1], flush=True)
    results = {
        **provenance(),
        "N": args.size,
        "table": table,
    }
    report(results)


def report(results):
    lines = [
        f"{results['N']}^3 particles in 256 Mpc/h, mesh x1, the 2LPT integrator. P/P_ref:",
        "against the converged reference (from a = 0.1, mesh x4, 40 FastPM steps), worst over",
        "k <= k_Nyq/4; P/P_40: against the same mesh's 40-step FastPM run, worst over",
        "k <= k_Nyq/2:",
        "",
        "| a_start | LPT | steps | P/P_ref at k_Nyq/8 / k_Nyq/4 / k_Nyq/2 | worst to k_Nyq/4 | "
        "r at the same k | P/P_40 at the same k | worst to k_Nyq/2 |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["table"]:
        lines.append(
            f"| {r['a_start']} | {r['lpt_order']} | {r['steps']} | "
            + " / ".join(f"{v:.3f}" for v in r["ratio"])
            + f" | {100 * r['dev_quarter']:.1f}% | "
            + " / ".join(f"{v:.4f}" for v in r["r"])
            + " | "
            + " / ".join(f"{v:.3f}" for v in r["ratio_same_mesh"])
            + f" | {100 * r['dev_half_same_mesh']:.1f}% |"
        )
    lines += [
        "",
        measured_on(results, "one CPU device"),
    ]
    publish(results, "\n".join(lines), "late_start.json", "late_start")


if __name__ == "__main__":
    main()
