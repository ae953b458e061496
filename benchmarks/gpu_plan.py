"""GPU memory plans, compiled for a GPU on this CPU-only machine, beside the CPU plan.

For each case below, ``distpm.plan.memory_plan`` compiles a run's programs twice in one
process, from shapes and shardings only: for 64 emulated CPU devices (today's CPU plan)
and, with ``target``, for as many H100s as the grid has (XLA's GPU compiler without a
GPU: ``distpm plan --target h100``), with JAX's allocator at 95% of each card
(``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95``, which also sets the compiler's own limit as a run
on the card would). Per program: GiB per device and bytes per particle (per device, over
N / P) of each, and what the GPU program holds that a GPU reads on the host (host
callbacks, loops whose trip count depends on data, conditionals). The GPU figures are
"compiled for, not run on" an H100.

Also, for the 2048^3 step on 4x2, the step compiled as if the card had unbounded memory
(so XLA's rematerialization has no limit to meet): the difference is what the
rematerialization (recomputing values instead of keeping them) saves.

    python benchmarks/gpu_plan.py          # needs XLA's GPU compiler: pip install ".[gpu]"
    PYTHONPATH=.gpu-compiler python benchmarks/gpu_plan.py   # or as .ci/run installs it
"""

import os

os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=64"
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.95"
os.environ["JAX_SKIP_CUDA_CONSTRAINTS_CHECK"] = "1"

import argparse  # noqa: E402
import datetime  # noqa: E402
import platform  # noqa: E402
import time  # noqa: E402

from timing import git_version, publish  # noqa: E402

import distpm  # noqa: E402
from distpm import plan  # noqa: E402
from distpm.parallel import targets  # noqa: E402
from distpm.parallel.devices import compiling_for  # noqa: E402
from distpm.runfile import HalosConfig  # noqa: E402

# N:grid:what ("forward": every program of a run, halos where they plan; "gradient": that too)
CASES = ("512:1x1:gradient", "256:4x2:gradient", "2048:4x2:forward", "4096:8x8:forward")
GIB = 2**30


def _config(n, grid):
    return distpm.SimConfig(box_size=2.0 * n, mesh_shape=n, n_steps=10).on(grid)


def _plan(cfg, gradient, target):
    """memory_plan with halos where FoF can be planned at this size, else without them
    (and the refusal)."""
    cosmo = distpm.Cosmology.planck18()
    try:
        return plan.memory_plan(
            cosmo, cfg, gradient=gradient, halos=HalosConfig(enabled=True), target=target
        ), None
    except ValueError as err:
        refused = str(err).splitlines()[0]
    return plan.memory_plan(cosmo, cfg, gradient=gradient, target=target), refused


def _rows(result):
    return {
        name: {
            "gib": m["total_bytes"] / GIB,
            "bytes_per_particle": m["bytes_per_particle"],
            "temp_gib": m["temp_bytes"] / GIB,
            "host_reads": [m["host_callbacks"], m["data_dependent_loops"], m["conditionals"]],
        }
        for name, m in result["programs"].items()
    }


def _unbounded_step(cfg):
    """The step's GiB per device where XLA's compiler plans for a card with no limit."""
    with compiling_for(targets.devices("h100", 8, limit=1e15)):
        fn, args, kwargs = plan._programs(distpm.Cosmology.planck18(), cfg, False)["step"]
        compiled = fn.lower(*args, **kwargs).compile()
    return plan.memory_per_device(compiled)["total_bytes"] / GIB


# (card, grid, mode) of the largest runs: N^3 particles, mesh = particles, 10 steps
LARGEST = (
    ("h100", (1, 1), "forward"), ("h100", (1, 1), "gradient"),
    ("h100", (4, 2), "forward"), ("h100", (4, 2), "gradient"),
    ("h200", (1, 1), "forward"), ("h200", (1, 1), "gradient"),
)  # fmt: skip
STEP = 32  # sizes tried: multiples of this


def _peak(n, grid, mode, card):
    """The largest program's bytes per device of a run (the gradient's with ``mode``), or
    None where the config refuses the size."""
    cosmo = distpm.Cosmology.planck18()
    try:
        result = plan.memory_plan(cosmo, _config(n, grid), gradient=mode == "gradient",
                                  target=card)  # fmt: skip
    except ValueError:
        return None
    if mode == "gradient":
        return result["programs"]["gradient"]["total_bytes"]
    return result["peak_bytes"]


def largest(card, grid, mode) -> dict:
    """The largest N (a multiple of STEP) whose programs fit ``card``'s budget on ``grid``:
    from the bytes per particle at a small size, then up or down until the edge."""
    budget = targets.budget_bytes(card)
    devices = grid[0] * grid[1]
    probe = 256 if devices > 1 else 128
    per_particle = _peak(probe, grid, mode, card) / (probe**3 / devices)
    n = int((budget * devices / per_particle) ** (1 / 3)) // STEP * STEP
    tried = {}
    while True:
        peak = tried[n] = _peak(n, grid, mode, card)
        fits = peak is not None and peak <= budget
        nxt = n + STEP if fits else n - STEP
        if nxt in tried:
            best = n if fits else nxt
            break
        n = nxt
    return {
        "card": card, "grid": f"{grid[0]}x{grid[1]}", "mode": mode, "n": best,
        "peak_gib": tried[best] / GIB, "budget_gib": budget / GIB,
        "next_gib": None if tried.get(best + STEP) is None else tried[best + STEP] / GIB,
    }  # fmt: skip


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", nargs="*", default=CASES)
    parser.add_argument("--largest", action=argparse.BooleanOptionalAction, default=True,
                        help="also find the largest runs that fit one and eight cards")  # fmt: skip
    args = parser.parse_args()
    rows = []
    for case in args.cases:
        n, grid, what = case.split(":")
        n, grid = int(n), tuple(int(p) for p in grid.split("x"))
        cfg = _config(n, grid)
        t0 = time.perf_counter()
        cpu, cpu_refused = _plan(cfg, what == "gradient", None)
        gpu, gpu_refused = _plan(cfg, what == "gradient", "h100")
        row = {
            "n": n,
            "grid": f"{grid[0]}x{grid[1]}",
            "cpu": _rows(cpu),
            "h100": _rows(gpu),
            "halos_refused": gpu_refused or cpu_refused,
            "budget_gib": gpu["target"]["budget_bytes"] / GIB,
            "seconds": time.perf_counter() - t0,
        }
        if (n, grid) == (2048, (4, 2)):
            row["step_without_rematerialization_gib"] = _unbounded_step(cfg)
        rows.append(row)
        print(case, f"{row['seconds']:.0f} s", flush=True)
    largest_runs = []
    if args.largest:
        for card, grid, mode in LARGEST:
            t0 = time.perf_counter()
            largest_runs.append(largest(card, grid, mode))
            print(largest_runs[-1], f"{time.perf_counter() - t0:.0f} s", flush=True)
    results = {
        "rows": rows,
        "largest": largest_runs,
        "card": targets.description("h100"),
        "fraction": targets.memory_fraction(),
        "machine": f"{platform.platform()} (no GPU: compiled for, not run on, H100s)",
        "cpus": os.cpu_count(),
        "distpm": git_version(),
        "date": datetime.date.today().isoformat(),
    }
    publish(results, table(results), "gpu_plan_h100.json", "gpu-plan")


def table(results) -> str:
    lines = [
        f"Compiled for, not run on, an {results['card']} (XLA's GPU compiler on a CPU, "
        f"allocator at {100 * results['fraction']:.0f}%), beside the CPU plan of the same "
        "programs; host reads: callbacks / loops on data / conditionals in the GPU program.",
        "",
        "| N^3, grid | program | H100 GiB/device | H100 B/particle | CPU B/particle | host reads |",
        "|---|---|---|---|---|---|",
    ]
    for row in results["rows"]:
        for name, g in row["h100"].items():
            c = row["cpu"].get(name, {})
            cpu_bpp = f"{c['bytes_per_particle']:.0f}" if c else "-"
            reads = "/".join(str(x) for x in g["host_reads"])
            lines.append(
                f"| {row['n']}^3, {row['grid']} | {name} | {g['gib']:.2f} | "
                f"{g['bytes_per_particle']:.0f} | {cpu_bpp} | {reads} |"
            )
        if row["halos_refused"]:
            lines.append(f"| {row['n']}^3, {row['grid']} | fof, catalogue | refused: "
                         f"{row['halos_refused'][:90]} | | | |")  # fmt: skip
        if "step_without_rematerialization_gib" in row:
            lines.append(
                f"| {row['n']}^3, {row['grid']} | step, no rematerialization | "
                f"{row['step_without_rematerialization_gib']:.2f} | | | |"
            )
    if results["largest"]:
        lines += ["", "The largest runs (N^3 particles, mesh = particles, 10 steps) whose "
                  "programs fit, by the GPU compiler:", "",
                  "| card | grid | run | largest N | its peak GiB/device | budget GiB |",
                  "|---|---|---|---|---|---|"]  # fmt: skip
        for r in results["largest"]:
            lines.append(
                f"| {r['card']} | {r['grid']} | {r['mode']} | {r['n']}^3 | "
                f"{r['peak_gib']:.2f} | {r['budget_gib']:.2f} |"
            )
    lines.append("")
    lines.append(
        f"H100 budget per device: {results['rows'][0]['budget_gib']:.2f} GiB. Compiled on "
        f"{results['machine']}, {results['cpus']} CPUs; distpm {results['distpm']}, "
        f"{results['date']}."
    )
    return "\n".join(lines)


if __name__ == "__main__":
    main()
