"""The seeds' benchmark: 2LPT initial conditions at 512^3 on 1, 8 and 24 emulated CPU devices.

The seeds' headline is a distributed 2LPT on a 2048^3 mesh on 24 GPUs; its
per-device memory is planned in ``plan.py`` (2048^3 on 4x2, and 2040^3 on
6x4: no 24-device grid divides 2048). Here the same program runs for real:
``distpm.initial_conditions`` (white noise drawn apart) at N^3 (mesh =
particles, box 2N Mpc/h, a = 0.1) on one device and on 8 and 24 devices
emulated on this machine's CPU, each grid in its own process: 512^3, the
largest run this machine holds on one device, and 480^3 on 6x4. Per grid:
compilation plus the first call, the median of ``--repeats`` calls after
it, the process's peak resident memory, and XLA's memory per device of the
compiled program (``distpm.plan``). The emulated devices share the same
cores, so the grids show the cost of the distributed algorithm, not a
speed-up.

    python benchmarks/initial_conditions.py            # ~6 min on 2 cores
    python benchmarks/initial_conditions.py --quick    # 64^3 and 48^3
"""

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from timing import measured_on, provenance, publish

GIB = 2**30
# 512^3: the largest run this machine holds on one device (big_run.py); 6x4 does not divide it
CASES = ("512:1x1", "512:4x2", "480:6x4")
QUICK = ("64:1x1", "64:4x2", "48:6x4")


def measure(case: str, repeats: int) -> dict:
    """One case, in this process (started with as many emulated devices as its grid)."""
    import statistics

    import jax

    import distpm
    from distpm import plan
    from distpm.parallel.decomposition import Decomposition

    n, grid = case.split(":")
    cfg = distpm.SimConfig(mesh_shape=int(n), box_size=2.0 * int(n), parallel=grid)
    cosmo = distpm.Cosmology.planck18()
    noise = jax.block_until_ready(distpm.white_noise(None, cfg))
    compiled = jax.jit(plan._start, static_argnames="cfg").lower(noise, cosmo, cfg=cfg).compile()
    planned = plan.memory_per_device(compiled)["total_bytes"]
    del compiled
    times = []
    for _ in range(1 + repeats):
        t0 = time.perf_counter()
        state = jax.block_until_ready(distpm.initial_conditions(noise, cosmo, cfg))
        times.append(time.perf_counter() - t0)
        del state  # one state at a time: the largest cases fill this machine's memory
    first, times = times[0], times[1:]
    return {
        "n": int(n),
        "grid": grid,
        "devices": Decomposition.of(cfg).n_devices,
        "particles_per_device": cfg.n_particles / Decomposition.of(cfg).n_devices,
        "first_call_s": first,
        "median_s": statistics.median(times),
        "all_s": times,
        "planned_bytes_per_device": planned,
        "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    }


def table(rows, prov) -> str:
    lines = [
        "| particles | grid | particles / device | compile + first call | median "
        "| planned / device | bytes / particle | peak RSS (all devices) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        per = r["planned_bytes_per_device"]
        lines.append(
            f"| {r['n']}^3 | {r['grid']} | {r['particles_per_device']:.3g} | "
            f"{r['first_call_s']:.1f} s | {r['median_s']:.1f} s | {per / GIB:.2f} GiB | "
            f"{per / r['particles_per_device']:.0f} | {r['peak_rss_bytes'] / GIB:.2f} GiB |"
        )
    return "\n".join(lines) + "\n\n" + measured_on(prov)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a check of the script")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a case, measured in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.repeats)), flush=True)
        return
    rows = []
    for case in QUICK if args.quick else CASES:
        px, py = (int(x) for x in case.split(":")[1].split("x"))
        env = {**os.environ, "JAX_PLATFORMS": "cpu", "DISTPM_COMPILE_CACHE": "off"}
        env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={px * py}"
        cmd = [sys.executable, __file__, "--one", case, "--repeats", str(args.repeats)]
        out = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr)
        rows.append(json.loads(out.stdout.splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    prov = provenance()
    if args.quick:
        print(table(rows, prov))
        return
    publish({"rows": rows, **prov}, table(rows, prov), "initial_conditions.json", "ics")


if __name__ == "__main__":
    main()
