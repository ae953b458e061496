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
are printed with every term (no GPU is measured). Writes
``results/scaling.json`` and the tables between the scaling markers of
``README.md``.

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
import datetime  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jaxlib  # noqa: E402
import numpy as np  # noqa: E402
from hlo import FALLBACK, KINDS, collective_ops, summarise  # noqa: E402
from step_split import split  # noqa: E402
from timing import HERE, git_version, publish, time_calls  # noqa: E402

import distpm  # noqa: E402
from distpm import simulation  # noqa: E402
from distpm.nbody import Schedule  # noqa: E402
from distpm.parallel.decomposition import Decomposition  # noqa: E402
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


# ---- projection (a model, not a measurement) ----------------------------------------

GPU = "NVIDIA H100 SXM 80 GB"
GPU_MEMORY = 80e9  # bytes
GPU_RATES = {  # assumed per GPU
    "fft_cells_per_s": 6e10,
    "paint_particles_per_s": 2e9,
    "readout_particles_per_s": 4e9,
}
NVLINK = 200e9  # bytes/s per GPU per direction
INFINIBAND = 40e9  # bytes/s per GPU: one 400 Gb/s NDR link per GPU
ASSUMPTIONS = [
    "Per-step time = local compute + communication, without overlap; work other than FFTs, "
    "paint and readout (sorting for migration, elementwise updates) is left out: the share of "
    "the 1-device CPU step that these three take is given above.",
    f"GPU = {GPU} (3.35 TB/s HBM3). 3-D real FFT: 6e10 cells/s per transform (3 "
    "one-dimensional passes and 2 transposes, each reading and writing the complex "
    "half-field, ~40 B per cell, at 2.5 TB/s, ~75% of the HBM bandwidth).",
    "CIC paint: 2e9 particles/s (8 float32 atomic adds per particle at ~2e10 atomics/s "
    "sustained, allowing for contention in clusters); CIC readout of a 3-vector field: 4e9 "
    "particles/s (8 gathers of 12 B, ~400 GB/s of scattered reads). Paint and readout process "
    "every buffer slot: capacity_factor x N^3/P per GPU (N^3 on one GPU).",
    "Links: NVLink4 through NVSwitch, 200 GB/s per GPU per direction (under half of the 450 GB/s "
    "peak); InfiniBand NDR, one 400 Gb/s link per GPU, 40 GB/s per GPU per direction when "
    "all GPUs of a node send off-node at once. Devices are numbered ix * py + iy with 8 per "
    "node, so on 8x8 the mesh axis y stays inside a node and x crosses nodes.",
    "Bytes: the measured collectives of the reference run (largest N on the largest grid with "
    "both axes split), scaled: FFT all-to-alls with the local field N^3/P; migration "
    "through the neighbours (two buffers of neighbour_factor x N^3/P slots per axis, sent "
    "full) with the local particle count; the full migration exchange, which a step takes "
    "only when particles go further or overflow those buffers, is left out; halo permutes with "
    "the pencil face, N x N/p of the other axis; reductions unchanged. An all-to-all over p "
    "devices keeps 1/p of its buffer local; latency is ignored (~20 collectives per step).",
    "Memory: XLA's analysis of the compiled in-place step and of the gradient of a run "
    "(`plan.py`, results/plan.json) at the same N and grid, where it was planned.",
]
ONE_NODE = {"x": NVLINK, "y": NVLINK}
TARGETS = (
    {
        "name": "512^3 on 1 GPU",
        "n": 512,
        "grid": [1, 1],
        "bw": ONE_NODE,
        "anchor": "pmwd: 95 ms per step at 512^3 on one H100 PCIe (2.0 TB/s HBM2e)",
    },
    {
        "name": "512^3 on 8 GPUs (1 node)",
        "n": 512,
        "grid": [4, 2],
        "bw": ONE_NODE,
        "anchor": "JaxPM: about 55 ms per step at 512^3 on 8 GPUs",
    },
    {
        "name": "1024^3 on 8 GPUs (1 node)",
        "n": 1024,
        "grid": [4, 2],
        "bw": ONE_NODE,
        "anchor": "JaxPM: about 0.5 s per step at 1024^3 on 8 GPUs",
    },
    {
        "name": "2048^3 on 8 GPUs (1 node)",
        "n": 2048,
        "grid": [4, 2],
        "bw": ONE_NODE,
        "anchor": "jaxDecomp/cuFFTMp: about 90-140 ms per 2048^3 c2c FFT on 8 GPUs",
        "c2c_fft": True,
    },
    {
        "name": "4096^3 on 64 GPUs (8 nodes)",
        "n": 4096,
        "grid": [8, 8],
        "bw": {"x": INFINIBAND, "y": NVLINK},
        "anchor": "-",
    },
)


def scaled_bytes(op, ref, target) -> float:
    """Bytes per device of a reference collective, scaled to the target's N and grid."""
    (n0, (px0, py0)), (n1, (px1, py1)) = ref, target
    volume = (n1**3 / (px1 * py1)) / (n0**3 / (px0 * py0))
    along = {"x": (px0, px1), "y": (py0, py1)}
    across = {"x": (py0, py1), "y": (px0, px1)}
    if op["role"] in ("migration", FALLBACK):  # p buckets of exchange_factor x N^3/P
        p0, p1 = along[op["axis"]]
        return op["bytes"] * volume * p1 / p0
    if op["role"] == "halo":
        q0, q1 = across[op["axis"]]
        return op["bytes"] * (n1**2 / q1) / (n0**2 / q0)
    if op["role"] == "reduction":
        return op["bytes"]
    return op["bytes"] * volume


def communication_terms(ref_run, target) -> list[dict]:
    """Time of the scaled collectives of ``ref_run`` on the target, per role and axis."""
    if math.prod(target["grid"]) == 1:
        return []
    ref = (ref_run["n"], ref_run["grid"])
    grid = dict(zip("xy", target["grid"], strict=True))
    groups = {}
    for op in ref_run["ops"]:
        if op["role"] == FALLBACK:  # a step takes it only when particles move far
            continue
        size = scaled_bytes(op, ref, (target["n"], target["grid"]))
        if op["kind"] == "all-to-all":
            size *= (grid[op["axis"]] - 1) / grid[op["axis"]]
        bw = min(target["bw"][a] for a in op["axis"])
        term = groups.setdefault((op["role"], op["axis"]), {"count": 0, "bytes": 0.0, "s": 0.0})
        term["count"] += 1
        term["bytes"] += size
        term["s"] += size / bw
    return [
        {
            "term": f"{r} ({a})",
            "basis": f"{t['count']} ops, {t['bytes'] / MIB:.1f} MiB sent per GPU "
            f"at {min(target['bw'][x] for x in a) / 1e9:g} GB/s",
            "s": t["s"],
        }
        for (r, a), t in groups.items()
    ]


def compute_terms(target, capacity_factor: float) -> list[dict]:
    """Time of the local FFTs, paint and readout per GPU at the assumed GPU rates."""
    cells = target["n"] ** 3 / math.prod(target["grid"])
    slots = cells if math.prod(target["grid"]) == 1 else capacity_factor * cells
    return [
        {
            "term": "FFTs",
            "basis": f"4 x {cells:.3g} cells / {GPU_RATES['fft_cells_per_s']:.3g} cells/s",
            "s": 4 * cells / GPU_RATES["fft_cells_per_s"],
        },
        {
            "term": "paint",
            "basis": f"{slots:.3g} slots / {GPU_RATES['paint_particles_per_s']:.3g} /s",
            "s": slots / GPU_RATES["paint_particles_per_s"],
        },
        {
            "term": "readout",
            "basis": f"{slots:.3g} slots / {GPU_RATES['readout_particles_per_s']:.3g} /s",
            "s": slots / GPU_RATES["readout_particles_per_s"],
        },
    ]


def c2c_fft_s(target) -> dict:
    """Model time of one 3-D complex-to-complex FFT of the N^3 mesh on the target: twice
    the bytes of a real transform locally, and one all-to-all of the complex64 field per
    split axis."""
    cells = target["n"] ** 3 / math.prod(target["grid"])
    compute = 2 * cells / GPU_RATES["fft_cells_per_s"]
    comm = sum(
        8 * cells * (p - 1) / p / target["bw"][axis]
        for axis, p in zip("xy", target["grid"], strict=True)
    )
    return {"compute_s": compute, "communication_s": comm, "total_s": compute + comm}


def planned_memory(target) -> dict | None:
    """The memory plan (results/plan.json) of the target's N and grid, if it was planned."""
    path = HERE / "results" / "plan.json"
    if not path.exists():
        return None
    grid = "{}x{}".format(*target["grid"])
    for row in json.loads(path.read_text())["rows"]:
        if row["n"] == target["n"] and row["grid"] == grid:
            if "refused" in row:
                return {"refused": row["refused"]}
            step, grad = row["step"]["total_bytes"], row["gradient"]["total_bytes"]
            return {
                "step_bytes": step,
                "gradient_bytes": grad,
                "step_fits": step <= GPU_MEMORY,
                "gradient_fits": grad <= GPU_MEMORY,
            }
    return None


def reference_run(runs):
    """The run whose collectives the projection scales: largest N, most devices, both axes split."""
    both = [r for r in runs if min(r["grid"]) > 1]
    return max(both, key=lambda r: (r["n"], r["devices"]), default=None)


def projection(runs, kernels) -> dict | None:
    """Per-step time of each target on GPUs, term by term (None without a reference run)."""
    ref = reference_run(runs)
    if ref is None:
        return None
    capacity_factor = config(ref["n"], tuple(ref["grid"])).parallel.capacity_factor
    cpu = {k: kernels[k] for k in GPU_RATES}
    out = {
        "note": "a model, not a measurement: no GPU was used",
        "assumptions": ASSUMPTIONS,
        "gpu": GPU,
        "gpu_rates": GPU_RATES,
        "cpu_rates_measured": cpu,
        "gpu_over_cpu": {k: GPU_RATES[k] / cpu[k] for k in GPU_RATES},
        "reference": {"n": ref["n"], "grid": ref["grid"]},
        "targets": [],
    }
    for target in TARGETS:
        compute = compute_terms(target, capacity_factor)
        comm = communication_terms(ref, target)
        out["targets"].append(
            {
                **target,
                "compute": compute,
                "communication": comm,
                "compute_s": sum(t["s"] for t in compute),
                "communication_s": sum(t["s"] for t in comm),
                "total_s": sum(t["s"] for t in compute + comm),
                "c2c_fft": c2c_fft_s(target) if target.get("c2c_fft") else None,
                "memory": planned_memory(target),
            }
        )
    return out


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


def projection_table(proj) -> list[str]:
    rows = ["| target | term | basis | time |", "|---|---|---|---|"]
    for t in proj["targets"]:
        for term in t["compute"] + t["communication"]:
            rows.append(
                f"| {t['name']} | {term['term']} | {term['basis']} | {1e3 * term['s']:.1f} ms |"
            )
        for key in ("compute_s", "communication_s", "total_s"):
            label = key.removesuffix("_s")
            rows.append(f"| {t['name']} | **{label}** | | **{1e3 * t[key]:.1f} ms** |")
    return rows


def summary_table(proj) -> list[str]:
    """Per target: the model's step, the published anchor, and the planned memory per GPU."""
    rows = [
        "| target | model step | published anchor | step memory / GPU "
        f"| fits {GPU_MEMORY / 1e9:g} GB | gradient memory / GPU |",
        "|---|---|---|---|---|---|",
    ]
    for t in proj["targets"]:
        model = f"{1e3 * t['total_s']:.0f} ms"
        if t["c2c_fft"]:
            model += f"; one c2c FFT {1e3 * t['c2c_fft']['total_s']:.0f} ms"
        mem = t["memory"]
        if mem is None:
            memory = ["not planned", "-", "-"]
        elif "refused" in mem:
            memory = ["refused: more than 2^31 slots per device", "no", "-"]
        else:
            memory = [
                f"{mem['step_bytes'] / 1e9:.0f} GB",
                "yes" if mem["step_fits"] else "no",
                f"{mem['gradient_bytes'] / 1e9:.0f} GB",
            ]
        rows.append(f"| {t['name']} | {model} | {t['anchor']} | " + " | ".join(memory) + " |")
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
    proj = results["projection"]
    if proj:
        ref = proj["reference"]
        parts += [
            "",
            f"**Projection on GPUs: a model, not a measurement** (collective bytes scaled from "
            f"{ref['n']}^3 on {ref['grid'][0]}x{ref['grid'][1]}). Assumptions:",
            "",
            *(f"- {a}" for a in proj["assumptions"]),
            "- The assumed GPU rates are "
            + ", ".join(f"{r:.0f}x" for r in proj["gpu_over_cpu"].values())
            + " (FFT, paint, readout) the measured one-device CPU rates above.",
            "",
            *projection_table(proj),
            "",
            *summary_table(proj),
        ]
    parts += [
        "",
        f"Measured on {results['date_utc']} on {results['machine']} ({results['cpu_count']} "
        f"cores), {DEVICES} emulated CPU devices, jax {results['jax']}, median of "
        f"{results['config']['repeats']} calls.",
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
        "date_utc": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": platform.platform(),
        "processor": platform.processor(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "distpm": distpm.__version__,
        "git": git_version(),
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
    results["projection"] = projection(results["runs"], results["kernels"])
    publish(results, markdown(results), "scaling.json", "scaling")


if __name__ == "__main__":
    main()
