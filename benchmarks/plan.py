"""Memory plans of big runs from their compiled programs, and the compilation cache.

1. For each size and device grid below (mesh = particles = N^3, box 2N
   Mpc/h, default capacity and exchange factors), ``distpm.plan`` compiles
   ahead of time, from shapes and shardings only (nothing is allocated), the
   initial conditions, the in-place step, an output's P(k) (the larger of
   the two output programs) and the gradient of a loss on the final density
   w.r.t. the white noise, on 64 emulated CPU devices in one process. It
   records XLA's memory per device, bytes per particle (per device, over
   N / P) and the bytes of the step's collectives per device (its compiled
   HLO, ``hlo.py``).
   A size the config refuses (per-device counts past int32, a grid that does
   not divide the mesh) is reported with the refusal. Compiling needs no
   memory of the run's size: every case compiles in seconds on this machine.
2. ``distpm run`` on its default config (64^3, 10 steps) three times in fresh
   processes: without the persistent compilation cache, then twice with a new
   cache directory (the first run fills it, the second finds every program).
   Wall time of the whole command, and distpm's own total.

    python benchmarks/plan.py                     # ~6 min on 2 cores
    python benchmarks/plan.py --cases 128:1x1 --no-cache-runs   # quick check
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from timing import measured_on, provenance, publish

DEVICES = 64
# the seeds' headline runs 2048^3 on 24 GPUs: no 24-device grid divides 2048 (the refusal is
# the table's row), so 2040^3, the nearest size below that 6x4 divides, stands in for it
CASES = ("512:1x1", "1024:4x2", "2048:4x2", "2048:8x8", "4096:8x8", "2048:6x4", "2040:6x4")
GIB = 2**30


def measure(case: str, gradient: bool) -> dict:
    """One case, in this process (started with DEVICES emulated devices)."""
    import hlo

    import distpm
    from distpm import plan

    n, grid = case.split(":")
    n, grid = int(n), tuple(int(x) for x in grid.split("x"))
    row = {
        "n": n,
        "grid": "x".join(map(str, grid)),
        "particles_per_device": n**3 / (grid[0] * grid[1]),
    }
    try:
        cfg = distpm.SimConfig(mesh_shape=n, box_size=2.0 * n, parallel=grid)
        programs = plan.compile_programs(distpm.Cosmology.planck18(), cfg, gradient=gradient)
    except ValueError as err:
        return {**row, "refused": str(err)}
    for name, (compiled, seconds) in programs.items():
        row[name] = plan.program_memory(compiled, seconds, cfg)
    ops = hlo.collective_ops(programs["step"][0].as_text(), grid)
    row["step_collectives"] = hlo.summarise(ops)
    return row


def timed_run(args, env) -> dict:
    t0 = time.perf_counter()
    out = subprocess.run(
        [sys.executable, "-m", "distpm.cli.main", "run", "--no-progress", "--overwrite", *args],
        env=env, capture_output=True, text=True,
    )  # fmt: skip
    wall = time.perf_counter() - t0
    if out.returncode:
        sys.exit(out.stderr)
    summary = json.loads((Path(args[args.index("--out") + 1]) / "summary.json").read_text())
    t = summary["timings"]
    return {"wall_s": wall, "total_s": t["total_s"], "steps_s": sum(t["steps_s"])}


def cache_runs(scratch: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["JAX_PLATFORMS"] = "cpu"
    cache = scratch / "cache"
    runs = {}
    for name, option in (("no cache", "off"), ("first", str(cache)), ("repeated", str(cache))):
        args = ["--compile-cache", option, "--out", str(scratch / name.replace(" ", "_"))]
        runs[name] = timed_run(args, env)
        print(f"{name}: {runs[name]['wall_s']:.1f} s", flush=True)
    runs["cache_mb"] = sum(f.stat().st_size for f in cache.rglob("*") if f.is_file()) / 1e6
    return runs


def table(rows) -> str:
    lines = [
        "| particles | grid | particles / device | initial conditions / device "
        "| bytes / particle | step / device | bytes / particle "
        "| output P(k) / device | bytes / particle "
        "| gradient / device | bytes / particle | step collectives / device "
        "| compile (step, grad.) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        head = f"| {r['n']}^3 | {r['grid']} | {r['particles_per_device']:.3g} |"
        if "refused" in r:
            lines.append(f"{head} refused: {r['refused']} | | | | | | | | | |")
            continue
        ics, s, g = r["initial_conditions"], r["step"], r.get("gradient")
        out = r["output_power"]
        grad = f"{g['total_bytes'] / GIB:.1f} GiB | {g['bytes_per_particle']:.0f}" if g else "- | -"
        compile_s = (
            f"{s['compile_s']:.0f} s, {g['compile_s']:.0f} s" if g else f"{s['compile_s']:.0f} s"
        )
        lines.append(
            f"{head} {ics['total_bytes'] / GIB:.1f} GiB | {ics['bytes_per_particle']:.0f} | "
            f"{s['total_bytes'] / GIB:.1f} GiB | {s['bytes_per_particle']:.0f} | "
            f"{out['total_bytes'] / GIB:.1f} GiB | {out['bytes_per_particle']:.0f} | {grad} | "
            f"{r['step_collectives']['total']['bytes'] / GIB:.2f} GiB | {compile_s} |"
        )
    return "\n".join(lines)


def cache_table(runs) -> str:
    lines = [
        "| `distpm run` (64^3, 10 steps) | wall time | distpm's total | steps |",
        "|---|---|---|---|",
    ]
    for name in ("no cache", "first", "repeated"):
        r = runs[name]
        lines.append(
            f"| {name} | {r['wall_s']:.1f} s | {r['total_s']:.1f} s | {r['steps_s']:.1f} s |"
        )
    lines.append(f"\nThe cache holds {runs['cache_mb']:.1f} MB after the first run.")
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", nargs="+", default=list(CASES), metavar="N:PXxPY")
    ap.add_argument("--no-gradient", action="store_true", help="plan the step only")
    ap.add_argument("--no-cache-runs", action="store_true")
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a case, measured in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, not args.no_gradient)), flush=True)
        return
    rows = []
    for case in args.cases:
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "DISTPM_COMPILE_CACHE": "off"}
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={DEVICES}"
        cmd = [sys.executable, __file__, "--one", case]
        cmd += ["--no-gradient"] if args.no_gradient else []
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr)
        rows.append(json.loads(out.stdout.splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    runs = None if args.no_cache_runs else cache_runs(Path(tempfile.mkdtemp(prefix="distpm_")))
    results = {
        "rows": rows,
        "cache_runs": runs,
        "devices": DEVICES,
        **provenance(),
    }
    text = table(rows) + ("" if runs is None else "\n\n" + cache_table(runs))
    text += "\n\n" + measured_on(results, f"{DEVICES} emulated CPU devices")
    publish(results, text, "plan.json", "plan")


if __name__ == "__main__":
    main()
