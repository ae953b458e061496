"""The biggest runs this machine holds, on one CPU device: `distpm run` and a gradient.

Runs ``distpm run`` (mesh = particles = N^3, box 2N Mpc/h, 10 steps from
a=0.1, default outputs) in a child process and records its time per step,
the peak resident memory of the process (``getrusage`` of the children),
XLA's planned memory of the step, and P(k) at a=1 against linear theory.
512^3 plans 6.6 GiB for the step (``distpm plan``) and peaks at ~15 GiB
(in the outputs), within this machine's 24 GB.

``--gradient`` instead times, in a child process, the gradient that
``distpm plan --gradient`` plans (``jax.grad`` of sum(delta^2) of the final
density with respect to the white noise, the same 10-step run): its
compilation and one call, the peak resident memory of the child, and XLA's
memory of that compiled program.

    python benchmarks/big_run.py                      # 512^3: ~5 min on 2 cores
    python benchmarks/big_run.py --n 128              # quick check
    python benchmarks/big_run.py --gradient --n 384   # ~10 min on 2 cores
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from timing import measured_on, provenance, publish

GIB = 2**30
K_SHOWN = (0.05, 0.1, 0.2, 0.5, 1.0)  # h/Mpc


def gradient_child(n: int):
    """In this process: compile and call the planned gradient at n^3; print a JSON line."""
    import jax

    from distpm import Cosmology, SimConfig, plan, white_noise

    cfg = SimConfig(mesh_shape=n, box_size=2.0 * n, parallel="1x1")
    cosmo = Cosmology.planck18()
    noise = jax.block_until_ready(white_noise(None, cfg))
    grad = jax.jit(jax.grad(plan._loss), static_argnames="cfg")
    t0 = time.perf_counter()
    compiled = grad.lower(noise, cosmo, cfg=cfg).compile()
    t1 = time.perf_counter()
    out = jax.block_until_ready(compiled(noise, cosmo))
    t2 = time.perf_counter()
    memory = plan.memory_per_device(compiled)
    row = {
        "n": n,
        "compile_s": t1 - t0,
        "gradient_s": t2 - t1,
        "planned_bytes": memory["total_bytes"],
    }
    row["finite"] = bool(jax.numpy.all(jax.numpy.isfinite(out)))
    print(json.dumps(row))


def gradient_run(n: int):
    """Measure the gradient at n^3 in a child process; its row replaces the earlier one of
    that n in results/big_gradient.json (the other sizes' rows stay: each takes minutes)."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", DISTPM_COMPILE_CACHE="off")
    cmd = [sys.executable, __file__, "--gradient-child", "--n", str(n)]
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if result.returncode:
        sys.exit(result.stderr)
    row = json.loads(result.stdout.strip().splitlines()[-1])
    row["peak_rss_bytes"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
    row.update(provenance())
    saved = Path(__file__).parent / "results" / "big_gradient.json"
    rows = json.loads(saved.read_text())["rows"] if saved.exists() else []
    rows = sorted([r for r in rows if r["n"] != n] + [row], key=lambda r: r["n"])
    lines = [
        "| particles | compile | gradient (one call) | peak RSS | planned (XLA) "
        "| peak RSS / particle | planned / particle | distpm, date |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = r["n"] ** 3
        lines.append(
            f"| {r['n']}^3 | {r['compile_s']:.0f} s | {r['gradient_s']:.0f} s | "
            f"{r['peak_rss_bytes'] / GIB:.2f} GiB | {r['planned_bytes'] / GIB:.2f} GiB | "
            f"{r['peak_rss_bytes'] / per:.0f} B | {r['planned_bytes'] / per:.0f} B | "
            f"{r['distpm']}, {r['date']} |"
        )
    publish({"rows": rows}, "\n".join(lines), "big_gradient.json", "big_gradient")


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    ap.add_argument("--gradient", action="store_true", help="time the largest gradient instead")
    ap.add_argument("--gradient-child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.gradient_child:
        return gradient_child(args.n)
    if args.gradient:
        return gradient_run(args.n)
    out = Path(tempfile.mkdtemp(prefix="distpm_big_")) / "out"
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env.update(JAX_PLATFORMS="cpu", DISTPM_COMPILE_CACHE="off")
    cmd = [sys.executable, "-m", "distpm.cli.main", "run", "--no-progress", "--devices", "1x1"]
    cmd += ["--set", f"mesh_shape={args.n}", "--set", f"box_size={2 * args.n}", "--out", str(out)]
    t0 = time.perf_counter()
    result = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if result.returncode:
        sys.exit(result.stderr)
    peak_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024  # kB on Linux
    summary = json.loads((out / "summary.json").read_text())
    k, p, modes, p_lin = np.loadtxt(out / "power.txt", unpack=True)[:4]  # then halofit
    shown = [int(np.argmin(np.abs(k - kk))) for kk in K_SHOWN]
    steps = summary["timings"]["steps_s"]
    row = {
        "n": args.n,
        "wall_s": wall,
        "total_s": summary["timings"]["total_s"],
        "initial_conditions_s": summary["timings"]["initial_conditions_s"],
        "step_median_s": float(np.median(steps)),
        "steps_s": steps,
        "peak_rss_bytes": peak_rss,
        "planned_step_bytes": summary["memory_per_device"]["step_memory_per_device"]["total_bytes"],
        "power": {
            name: x.tolist() for name, x in (("k", k), ("p", p), ("modes", modes), ("p_lin", p_lin))
        },
    }
    ratios = ", ".join(f"{k[i]:.2f}: {p[i] / p_lin[i]:.2f}" for i in shown)
    text = "\n".join(
        [
            "| particles | total | initial conditions | step (median of 10) | peak RSS "
            "| planned step memory | P / P_lin at k [h/Mpc] |",
            "|---|---|---|---|---|---|---|",
            f"| {args.n}^3 | {row['total_s']:.0f} s | {row['initial_conditions_s']:.1f} s | "
            f"{row['step_median_s']:.1f} s | {peak_rss / GIB:.2f} GiB | "
            f"{row['planned_step_bytes'] / GIB:.2f} GiB | {ratios} |",
        ]
    )
    results = {
        "run": row,
        **provenance(),
    }
    text += "\n\n" + measured_on(results, "one CPU device")
    publish(results, text, "big_run.json", "big_run")


if __name__ == "__main__":
    main()
