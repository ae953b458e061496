"""The biggest run this machine holds: `distpm run` at N^3 on one CPU device.

Runs ``distpm run`` (mesh = particles = N^3, box 2N Mpc/h, 10 steps from
a=0.1, default outputs) in a child process and records its time per step,
the peak resident memory of the process (``getrusage`` of the children),
XLA's planned memory of the step, and P(k) at a=1 against linear theory.
512^3 plans 6.6 GiB for the step (``distpm plan``) and peaks at ~15 GiB
(in the outputs), within this machine's 24 GB.

    python benchmarks/big_run.py            # 512^3: ~5 min on 2 cores
    python benchmarks/big_run.py --n 128    # quick check
"""

import argparse
import datetime
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from timing import git_version, publish

GIB = 2**30
K_SHOWN = (0.05, 0.1, 0.2, 0.5, 1.0)  # h/Mpc


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=512)
    args = ap.parse_args()
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
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "distpm": git_version(),
        "date": datetime.date.today().isoformat(),
    }
    publish(results, text, "big_run.json", "big_run")


if __name__ == "__main__":
    main()
