"""Accuracy per cost in few steps: each integrator and LPT order against a converged reference.

For N^3 particles in a 256 Mpc/h box (from a=0.1, Planck18, float32, CIC, one
CPU device), each integrator ("fastpm", "2lpt"), LPT order of the initial
conditions (2, 3), mesh ratio (1, 2) and number of steps (3, 5, 10, 20): P/P_ref
and r at k_Nyq/8, k_Nyq/4 and k_Nyq/2 of the particle grid against a reference
of the same white noise and LPT order (mesh 4x the particle grid, 40 steps,
FastPM; :mod:`distpm.analysis.convergence`), the cost per step, and the fewest
steps of those that reach 1% at every k <= k_Nyq/4 and 3% at every k <= k_Nyq/2.
The 2LPT reference is shown converged by the same comparison of its 80-step run;
the 3LPT reference is compared with the 2LPT one (what the third order of the
initial conditions changes at a = 1).

    python benchmarks/few_steps.py                  # 64^3 and 128^3: ~40 min on 2 cores
    python benchmarks/few_steps.py --sizes 32       # quick check
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import time  # noqa: E402

from accuracy import evolve_timed, fmt_row, row  # noqa: E402
from timing import measured_on, provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm.analysis import convergence  # noqa: E402

KEYS = ["N", "mesh_ratio", "integrator", "lpt_order", "steps"]
CHECK_KEYS = ["N", "reference", "against"]


def fewest(rows, half=True):
    """The fewest steps from which on (every larger number of steps measured too) P is within
    1% of the reference for k <= k_Nyq/4 and, with ``half``, 3% for k <= k_Nyq/2; or None.
    From which on: a mesh error and a time-step error of opposite signs can cancel at one
    number of steps only."""
    good = [r["dev_quarter"] <= 0.01 and (r["max_deviation"] <= 0.03 or not half) for r in rows]
    steps = [r["steps"] for r in rows]
    ok = [n for i, n in enumerate(steps) if all(good[i:])]
    return min(ok) if ok else None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--steps", type=int, nargs="+", default=[3, 5, 10, 20])
    ap.add_argument("--box", type=float, default=256.0)
    args = ap.parse_args()

    table, reference_check = [], []
    for n in args.sizes:
        base = distpm.SimConfig(box_size=args.box, mesh_shape=n, parallel="1x1")
        noise = distpm.white_noise(0, base)
        references = {}
        for order in (2, 3):
            ref_cfg = convergence.reference_config(base.replace(lpt_order=order))
            t = time.perf_counter()
            references[order] = evolve_timed(noise, ref_cfg)[0], ref_cfg
            print(f"N={n}: LPT {order} reference: {time.perf_counter() - t:.0f} s", flush=True)
        longer = references[2][1].replace(n_steps=80)
        result = convergence.compare(evolve_timed(noise, longer)[0], longer, *references[2])
        checks = [row(result, N=n, reference="LPT 2, 40 steps", against="LPT 2, 80 steps")]
        result = convergence.compare(*references[3], *references[2])
        checks.append(row(result, N=n, reference="LPT 2, 40 steps", against="LPT 3, 40 steps"))
        for check in checks:
            print(fmt_row(check, CHECK_KEYS), flush=True)
        reference_check += checks
        for ratio in (1, 2):
            for integrator in ("fastpm", "2lpt"):
                for order in (2, 3):
                    rows = []
                    for steps in args.steps:
                        cfg = base.replace(
                            mesh_shape=ratio * n, integrator=integrator, lpt_order=order,
                            n_steps=steps,
                        )  # fmt: skip
                        final, per_step = evolve_timed(noise, cfg)
                        result = convergence.compare(final, cfg, *references[order])
                        values = (n, ratio, integrator, order, steps)
                        settings = dict(zip(KEYS, values, strict=True))
                        rows.append(row(result, **settings, s_per_step=per_step))
                        rows[-1]["dev_quarter"] = result.worst(result.k_nyquist / 4)[0]
                        print(fmt_row(rows[-1], KEYS), flush=True)
                    table += rows
    results = {
        **provenance(),
        "box": args.box,
        "reference": {"mesh_factor": 4, "steps": 40, "integrator": "fastpm"},
        "table": table,
        "reference_check": reference_check,
    }
    report(results)


def report(results):
    """Add the steps each setting needs to ``results``, and publish them with the tables."""
    table, reference_check = results["table"], results["reference_check"]
    settings = dict.fromkeys(tuple(r[k] for k in KEYS[:4]) for r in table)
    needed = []
    for setting in settings:
        rows = [r for r in table if tuple(r[k] for k in KEYS[:4]) == setting]
        needed.append(dict(zip(KEYS[:4], setting, strict=True)))
        needed[-1].update(steps_needed=fewest(rows), steps_needed_quarter=fewest(rows, False))
    results["steps_needed"] = needed
    head = (
        "P/P_ref at k_Nyq/8 / k_Nyq/4 / k_Nyq/2 | r at the same k | max \\|P/P_ref - 1\\| | min r"
    )
    most = max(r["steps"] for r in table)
    lines = [
        f"Box {results['box']:g} Mpc/h, CIC; reference: the same LPT order, mesh 4x the particle "
        "grid, 40 steps (FastPM); k_Nyq of the particle grid; worst values over k <= k_Nyq/2:",
        "",
        f"| N | mesh ratio | integrator | LPT | steps | {head} | cost per step |",
        "|---|---|---|---|---|---|---|---|---|---|",
        *[fmt_row(r, KEYS) for r in table],
        "",
        "Fewest of these steps from which on P is within 1% of the reference at every",
        "k <= k_Nyq/4, and also within 3% at every k <= k_Nyq/2 (where the mesh's own error,",
        "seen at 20 steps, may exceed 3% whatever the steps):",
        "",
        "| N | mesh ratio | integrator | LPT | 1% to k_Nyq/4 | and 3% to k_Nyq/2 |",
        "|---|---|---|---|---|---|",
        *[
            f"| {r['N']} | {r['mesh_ratio']} | {r['integrator']} | {r['lpt_order']} | "
            f"{r['steps_needed_quarter'] or f'more than {most}'} | "
            f"{r['steps_needed'] or f'more than {most}'} |"
            for r in needed
        ],
        "",
        "The references: the 2LPT one against its 80-step run (its convergence in steps), and",
        "against the 3LPT one (what the third order of the initial conditions changes):",
        "",
        f"| N | reference | against | {head} |",
        "|---|---|---|---|---|---|---|",
        *[fmt_row(r, CHECK_KEYS) for r in reference_check],
        "",
        measured_on(results, "one CPU device"),
    ]
    publish(results, "\n".join(lines), "few_steps.json", "few_steps")


if __name__ == "__main__":
    main()
