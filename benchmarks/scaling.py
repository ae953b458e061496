"""Scaling of one sharded PM step over 1-8 emulated CPU devices, with a GPU projection.

One process with 8 emulated CPU devices (XLA's host platform). For each N
(mesh = particles = N^3, box 4N Mpc/h) and device grid, the jitted
kick-drift-kick step ``distpm.simulation.step`` is lowered and compiled
once, then timed on the 2LPT state at a=0.1: ``--repeats`` calls from the
same state after a warm-up, each ended with ``jax.block_until_ready``
(``timing.time_calls``). For each compiled step it records XLA's memory per
device (also for ``step_in_place``, the CLI's step, which reuses the input
state's buffers) and the collectives of the compiled HLO module: every collective
instruction of the module text is counted once (async ``-start``/``-done``
pairs once), with the bytes of its result per device.

Then it times the parts of one force on one device (``step_split.split``) and
projects the time of a step on GPUs with a simple model whose assumptions
are printed with every term (``projection.py``; no GPU is measured). Writes
``results/scaling.json`` and the tables between the scaling markers of
``scaling.md``.

    python benchmarks/scaling.py                                  # full run
    python benchmarks/scaling.py --sizes 32 --repeats 1 --kernel-n 32   # quick check
"""

import os

DEVICES = 8  # emulated CPU devices; XLA reads the flag when jax starts
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + f" --xla_force_host_platform_device_count={DEVICES}"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from hlo import FALLBACK, KINDS, collective_ops, summarise  # noqa: E402
from projection import projection, projection_markdown  # noqa: E402
from step_split import split  # noqa: E402
from timing import measured_on, provenance, publish, time_calls  # noqa: E402

import distpm  # noqa: E402
from distpm import simulation  # noqa: E402
from distpm.nbody import Schedule  # noqa: E402
from distpm.parallel.decomposition import Decomposition, ParallelOptions  # noqa: E402
from distpm.parallel.devices import parse_devices  # noqa: E402
from distpm.parallel.migrate import check as check_capacity  # noqa: E402
from distpm.plan import memory_per_device  # noqa: E402

MIB = 2.0**20

# ---- measurements -----------------------------------------------------------------


def config(n: int, grid) -> distpm.SimConfig:
    """N^3 particles on an N^3 mesh in a box of 4N Mpc/h, on ``grid``."""
    return distpm.SimConfig(box_size=4.0 * n, mesh_shape=n, n_steps=10, parallel=grid)


def timed_step(n: int, grid, repeats: int):
    """Compile the first step for N on ``grid`` and time it.

    Returns (config, compiled step, compile seconds, timings, buffer needs, the
    step's arguments).
    """
    cfg = config(n, grid)
    cosmo = distpm.Cosmology.planck18()
    state = distpm.initial_conditions(distpm.white_noise(0, cfg), cosmo, cfg)
    sched = Schedule.of(cosmo, cfg)
    state, needs = simulation.kick(state, sched.factors[0, 0], cosmo, cfg)
    check_capacity(needs, cfg)
    factors = sched.kicks()[0]
    a_next = np.float32(cfg.time_grid[1])
    t = time.perf_counter()
    compiled = simulation.step.lower(state, factors, a_next, cosmo, cfg=cfg).compile()
    compile_s = time.perf_counter() - t
    (_, needs), timing = time_calls(compiled, state, factors, a_next, cosmo, repeats=repeats)
    check_capacity(needs, cfg)
    return cfg, compiled, compile_s, timing, needs, (state, factors, a_next, cosmo)


def measure_step(n: int, grid, repeats: int) -> dict:
    """Compile one step for N and grid; time it, read its memory and collectives."""
    cfg, compiled, compile_s, timing, needs, args = timed_step(n, grid, repeats)
    in_place = simulation.step_in_place.lower(*args, cfg=cfg).compile()  # the CLI's step
    needs = jax.device_get(needs)
    needed_capacity, needed_bucket = int(needs["capacity"]), int(needs["exchange"])
    ops = collective_ops(compiled.as_text(), grid)
    return {
        "n": n,
        "grid": list(grid),
        "devices": Decomposition.of(cfg).n_devices,
        "sim_config": cfg.to_dict(),
        "capacity": Decomposition.of(cfg).capacity,
        "exchange_size": Decomposition.of(cfg).exchange_size,
        "neighbour_size": Decomposition.of(cfg).neighbour_size,
        "step_needed_capacity": needed_capacity,  # slots the step used (largest device)
        "step_needed_bucket": needed_bucket,  # largest migration bucket the step filled
        "compile_s": compile_s,
        "first_call_s": timing["compile_s"],
        "median_s": timing["median_s"],
        "all_s": timing["all_s"],
        "memory": memory_per_device(compiled),
        "memory_in_place": memory_per_device(in_place),
        "collectives": summarise(ops),
        "ops": ops,
    }


def kernel_rates(n: int, repeats: int) -> dict:
    """One-device times of the parts of a force (``step_split``) and their throughputs."""
    parts = split(n, repeats)
    cells = n**3
    return {
        **parts,
        "fft_cells_per_s": 4 * cells / parts["ffts_s"],  # 1 forward + 3 inverse transforms
        "paint_particles_per_s": cells / parts["paint_s"],
        "readout_particles_per_s": cells / parts["readout_s"],
    }


# ---- output -----------------------------------------------------------------------


def step_table(runs) -> list[str]:
    rows = [
        "| N | devices | grid | step (median) | compile | memory / device | vs 1 device "
        "| in place |",
        "|---|---|---|---|---|---|---|---|",
    ]
    one = {r["n"]: r["memory"]["total_bytes"] for r in runs if r["devices"] == 1}
    for r in runs:
        mem = r["memory"]["total_bytes"]
        ratio = f"{mem / one[r['n']]:.2f}" if r["n"] in one else "-"
        in_place = r["memory_in_place"]["total_bytes"] / MIB
        rows.append(
            f"| {r['n']} | {r['devices']} | {r['grid'][0]}x{r['grid'][1]} | "
            f"{r['median_s']:.3f} s | {r['compile_s']:.1f} s | {mem / MIB:.1f} MiB | {ratio} "
            f"| {in_place:.1f} MiB |"
        )
    return rows


def collective_table(runs) -> list[str]:
    kinds = (*KINDS, "total")
    extra = ("of it migration", "fallback migration")
    rows = [
        "| N | grid | " + " | ".join((*kinds, *extra)) + " |",
        "|---|---|" + "---|" * (len(kinds) + len(extra)),
    ]
    empty = {"count": 0, "bytes": 0}
    for r in runs:
        roles = r["collectives"]["roles"]
        migration = [roles.get(k, empty) for k in ("migration", "migration (neighbours)")]
        columns = [r["collectives"][k] for k in kinds]
        columns.append({k: sum(m[k] for m in migration) for k in empty})
        columns.append(roles.get(FALLBACK, empty))
        cells = [f"{c['count']} / {c['bytes'] / MIB:.2f}" if c["count"] else "-" for c in columns]
        rows.append(f"| {r['n']} | {r['grid'][0]}x{r['grid'][1]} | " + " | ".join(cells) + " |")
    return rows


def kernel_line(kernels, runs) -> str:
    n = kernels["mesh"]
    text = (
        f"One device, {n}^3, parts of one force: FFTs {1e3 * kernels['ffts_s']:.1f} ms "
        f"({kernels['fft_cells_per_s']:.3g} cells/s per transform), paint "
        f"{1e3 * kernels['paint_s']:.1f} ms ({kernels['paint_particles_per_s']:.3g} particles/s), "
        f"readout {1e3 * kernels['readout_s']:.1f} ms "
        f"({kernels['readout_particles_per_s']:.3g} particles/s)"
    )
    step = [r["median_s"] for r in runs if r["n"] == n and r["devices"] == 1]
    if step:
        share = (kernels["ffts_s"] + kernels["paint_s"] + kernels["readout_s"]) / step[0]
        text += f"; together {share:.0%} of the 1-device step ({1e3 * step[0]:.0f} ms)"
    return text + "."


def markdown(results) -> str:
    parts = [
        "Step time and XLA's memory per device (argument + output + temp - alias); "
        "*in place*: the memory of `step_in_place` (the CLI's step), whose output "
        "reuses the input state's buffers:",
        "",
        *step_table(results["runs"]),
        "",
        "Collectives per step in the compiled HLO, count / MiB per device (result sizes). A step "
        "migrates through its neighbours first; the full exchange (last column) is compiled in "
        "as a fallback and runs only when particles go further or overflow the neighbours' "
        "buffers, so it is not in the total:",
        "",
        *collective_table(results["runs"]),
        "",
        kernel_line(results["kernels"], results["runs"]),
    ]
    if results["projection"]:
        parts += ["", *projection_markdown(results["projection"])]
    parts += [
        "",
        measured_on(
            results,
            f"{DEVICES} emulated CPU devices, median of {results['config']['repeats']} calls",
        ),
    ]
    return "\n".join(parts)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="N: N^3 mesh")
    ap.add_argument(
        "--grids", nargs="+", default=["1x1", "2x1", "2x2", "4x2"], help=f"PXxPY, at most {DEVICES}"
    )
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--kernel-n", type=int, default=128, help="N of the 1-device kernel timings")
    args = ap.parse_args()
    grids = [parse_devices(g) for g in args.grids]
    results = {
        **provenance(),
        "processor": platform.processor(),
        "python": platform.python_version(),
        "jaxlib": jaxlib.__version__,
        "xla_flags": os.environ["XLA_FLAGS"],
        "config": {
            "sizes": args.sizes,
            "grids": [list(g) for g in grids],
            "repeats": args.repeats,
            "kernel_n": args.kernel_n,
            "box_size": "4 N Mpc/h",
        },
        "runs": [],
    }
    for n in args.sizes:
        for grid in grids:
            print(f"N={n} grid={grid[0]}x{grid[1]}", file=sys.stderr, flush=True)
            run = measure_step(n, grid, args.repeats)
            print(f"  {run['median_s']:.3f} s/step", file=sys.stderr, flush=True)
            results["runs"].append(run)
    print(f"kernels at N={args.kernel_n} on one device", file=sys.stderr, flush=True)
    results["kernels"] = kernel_rates(args.kernel_n, args.repeats)
    factor = ParallelOptions().capacity_factor  # the runs' (config())
    results["projection"] = projection(results["runs"], results["kernels"], factor)
    publish(results, markdown(results), "scaling.json", "scaling")


if __name__ == "__main__":
    main()
