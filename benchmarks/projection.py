"""A model of a PM step's time on GPUs, scaled from measurements on CPU devices.

Not a measurement: no GPU is used. ``scaling.py`` measures one step's collectives on emulated
CPU devices and the parts of one force on one device; :func:`projection` scales them to the
``TARGETS`` (N and GPU grid) with the rates and links of ``ASSUMPTIONS``, term by term, and
:func:`projection_markdown` writes the tables that ``scaling.py`` puts in ``scaling.md``.
"""

import json
import math

from hlo import FALLBACK
from timing import HERE

MIB = 2.0**20

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


def projection(runs, kernels, capacity_factor: float) -> dict | None:
    """Per-step time of each target on GPUs, term by term (None without a reference run).

    runs, kernels: the measurements of ``scaling.py``; capacity_factor: its runs' (slots per
    device over N^3/P, which paint and readout process)."""
    ref = reference_run(runs)
    if ref is None:
        return None
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


def projection_markdown(proj) -> list[str]:
    """The projection's lines on scaling.md: assumptions, terms, and the summary per target."""
    ref = proj["reference"]
    return [
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
