"""Accuracy table: P(k) and r(k) of production settings against a converged reference.

For N^3 particles in a 256 Mpc/h box (2LPT from a=0.1, Planck18, float32,
one CPU device) and each mesh ratio (mesh / particle grid), mass assignment
and number of steps, the final particles are compared with a reference run
of the same white noise: mesh 4x finer than the particle grid, 40 steps
(:mod:`distpm.analysis.convergence`, which also removes the mesh-dependent
half-cell offset of the particle lattice and paints both on one CIC mesh
twice the particle grid). Reported at k_Nyq/8, k_Nyq/4 and k_Nyq/2 of the
particle grid: P/P_ref and the cross-correlation r; and the worst of each
for k <= k_Nyq/2. The cost per step is the compiled evolution's time
(including its first force) divided by the steps, one call after compiling.

A second table, at the smallest N and 10 steps, shows every combination of
force compensation and gradient kernel, the evidence for the defaults.
A third checks the reference itself: 40 against 80 steps.

    python benchmarks/accuracy.py                       # 64^3 and 128^3: ~30 min on 2 cores
    python benchmarks/accuracy.py --sizes 32 --steps 10 # quick check
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
from timing import measured_on, provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm import simulation  # noqa: E402
from distpm.analysis import convergence  # noqa: E402
from distpm.parallel.migrate import check as check_capacity  # noqa: E402

COSMO = distpm.Cosmology.planck18()
FRACTIONS = (8, 4, 2)  # k = k_Nyq / f


def evolve_timed(noise, cfg):
    """(final particles, seconds per step) of a compiled evolution from the 2LPT state."""
    state = distpm.initial_conditions(noise, COSMO, cfg)
    compiled = simulation._evolve.lower(state, COSMO, (), cfg=cfg).compile()
    t = time.perf_counter()
    states, _, needs = jax.block_until_ready(compiled(state, COSMO, ()))
    elapsed = time.perf_counter() - t
    check_capacity(needs, cfg)
    return states[-1], elapsed / cfg.n_steps


def row(result, **fields):
    """One table row: the settings, then P/P_ref and r at k_Nyq/f, then the worst of each."""
    k_nyq = result.k_nyquist
    at = [result.at(k_nyq / f) for f in FRACTIONS]
    deviation, r_min = result.worst(k_nyq / 2)
    return {
        **fields,
        "k": [float(result.k[i]) for i in at],
        "ratio": [float(result.ratio[i]) for i in at],
        "r": [float(result.r[i]) for i in at],
        "max_deviation": deviation,
        "min_r": r_min,
    }


def fmt_row(r, keys):
    cells = [str(r[k]) for k in keys]
    cells += [" / ".join(f"{v:.3f}" for v in r["ratio"]), " / ".join(f"{v:.4f}" for v in r["r"])]
    cells += [f"{100 * r['max_deviation']:.1f}%", f"{r['min_r']:.4f}"]
    if "s_per_step" in r:
        cells.append(f"{r['s_per_step']:.3f} s")
    return "| " + " | ".join(cells) + " |"


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--steps", type=int, nargs="+", default=[5, 10, 20, 40])
    ap.add_argument("--ratios", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--box", type=float, default=256.0)
    ap.add_argument("--ref-mesh-factor", type=int, default=4)
    ap.add_argument("--ref-steps", type=int, default=40)
    args = ap.parse_args()

    table, alternatives, reference_check = [], [], []
    for n in args.sizes:
        base = distpm.SimConfig(box_size=args.box, mesh_shape=n, parallel="1x1")
        noise = distpm.white_noise(0, base)
        ref_cfg = convergence.reference_config(
            base, mesh_factor=args.ref_mesh_factor, n_steps=args.ref_steps
        )
        t = time.perf_counter()
        reference, _ = evolve_timed(noise, ref_cfg)
        print(f"N={n}: reference {ref_cfg.mesh_shape[0]}^3 mesh, {ref_cfg.n_steps} steps: "
              f"{time.perf_counter() - t:.0f} s", flush=True)  # fmt: skip
        for ratio in args.ratios:
            for paint in ("cic", "tsc"):
                for steps in args.steps:
                    cfg = base.replace(mesh_shape=ratio * n, paint=paint, n_steps=steps)
                    final, per_step = evolve_timed(noise, cfg)
                    result = convergence.compare(final, cfg, reference, ref_cfg)
                    settings = dict(N=n, mesh_ratio=ratio, paint=paint, steps=steps)
                    table.append(row(result, **settings, s_per_step=per_step))
                    print(fmt_row(table[-1], list(settings)), flush=True)
        if n != min(args.sizes):
            continue
        steps = 10 if 10 in args.steps else args.steps[0]
        for ratio in args.ratios:
            for paint in ("cic", "tsc"):
                for gradient in ("fd", "ik"):
                    for compensate in (True, False):
                        cfg = base.replace(
                            mesh_shape=ratio * n, paint=paint, n_steps=steps,
                            force_gradient=gradient, compensate_force=compensate,
                        )  # fmt: skip
                        final, _ = evolve_timed(noise, cfg)
                        result = convergence.compare(final, cfg, reference, ref_cfg)
                        default = (
                            cfg.gradient_kind == base.replace(paint=paint).gradient_kind
                            and compensate == cfg.replace(compensate_force="auto").force_compensated
                        )
                        settings = dict(
                            N=n, mesh_ratio=ratio, paint=paint, gradient=gradient,
                            compensated=compensate, default="yes" if default else "",
                        )  # fmt: skip
                        alternatives.append(row(result, **settings))
                        print(fmt_row(alternatives[-1], list(settings)), flush=True)
        longer = ref_cfg.replace(n_steps=2 * ref_cfg.n_steps)
        final, _ = evolve_timed(noise, longer)
        result = convergence.compare(final, longer, reference, ref_cfg)
        settings = dict(N=n, mesh_ratio=args.ref_mesh_factor, steps=longer.n_steps)
        reference_check.append(row(result, **settings))
        print(fmt_row(reference_check[-1], list(settings)), flush=True)

    head = (
        "P/P_ref at k_Nyq/8 / k_Nyq/4 / k_Nyq/2 | r at the same k | max \\|P/P_ref - 1\\| | min r"
    )
    lines = [
        f'Defaults (`compensate_force` and `force_gradient` "auto"), box {args.box:g} Mpc/h; '
        f"reference: mesh {args.ref_mesh_factor}x the particle grid, {args.ref_steps} steps; "
        "k_Nyq of the particle grid; worst values over k <= k_Nyq/2:",
        "",
        f"| N | mesh ratio | paint | steps | {head} | cost per step |",
        "|---|---|---|---|---|---|---|---|---|",
        *[fmt_row(r, ["N", "mesh_ratio", "paint", "steps"]) for r in table],
    ]
    if alternatives:
        lines += [
            "",
            'Every force kernel at 10 steps (*default*: what "auto" picks):',
            "",
            f"| N | mesh ratio | paint | gradient | compensated | default | {head} |",
            "|---|---|---|---|---|---|---|---|---|---|",
            *[
                fmt_row(r, ["N", "mesh_ratio", "paint", "gradient", "compensated", "default"])
                for r in alternatives
            ],
            "",
            "The reference's own convergence (twice its steps, against it):",
            "",
            f"| N | mesh ratio | steps | {head} |",
            "|---|---|---|---|---|---|---|",
            *[fmt_row(r, ["N", "mesh_ratio", "steps"]) for r in reference_check],
        ]
    where = provenance()
    lines += ["", measured_on(where, "one CPU device")]
    results = {
        **where,
        "box": args.box,
        "reference": {"mesh_factor": args.ref_mesh_factor, "steps": args.ref_steps},
        "k_fractions_of_nyquist": [1 / f for f in FRACTIONS],
        "defaults": table,
        "alternatives": alternatives,
        "reference_check": reference_check,
    }
    publish(results, "\n".join(lines), "accuracy.json", "accuracy")


if __name__ == "__main__":
    main()
