"""The measurements of the GPU check, one per process: ``python steps.py NAME '{json options}'``.

Each prints one JSON line on stdout (a dict; :mod:`check` adds the step's name,
its options and its wall time). The standard problem (``problem``, as
``benchmarks/distpm_problem.py`` and ``pmwd_problem.py``): N^3 particles in a
periodic box of 256 Mpc/h, Planck18, Eisenstein-Hu P(k), 2LPT at a = 0.1, 10
kick-drift-kick steps to a = 1, float32. The other steps take 2 Mpc/h per
particle (halos, the GPU-against-CPU comparison) or 8 (the lightcone). Times:
the first call (compile + run, ``compile_s``), then ``repeats`` calls each
ended with ``block_until_ready``, ``median_s`` their median. GPU memory:
the device's ``peak_bytes_in_use`` (None on the CPU, whose allocator does
not say).

Steps: ``env``, ``problem`` (forward or gradient), ``plan`` (distpm's plan
of a run and the peak of that run), ``halos`` (FoF + catalogue, kNN k = 8,
Morton sort; writes the positions for jz-tree), ``lightcone`` (the cost of
recording the lightcone), ``reference`` (white noise, final density and FoF
labels of one seed, saved for the GPU-against-CPU comparison) and
``compare`` (that comparison).
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def _config(n, mesh_factor=1, box=None, **extra):
    """N^3 particles on a (mesh_factor N)^3 mesh in a box [Mpc/h] (default 2 Mpc/h per
    particle), 2LPT at a = 0.1, 10 steps, one device."""
    import distpm

    return distpm.SimConfig(
        mesh_shape=mesh_factor * n,
        particle_shape=n,
        box_size=box or 2.0 * n,
        a_start=0.1,
        n_steps=extra.pop("steps", 10),
        **extra,
        parallel=(1, 1),
    )


def _memory() -> dict:
    import jax

    stats = jax.local_devices()[0].memory_stats() or {}
    peak, limit = stats.get("peak_bytes_in_use"), stats.get("bytes_limit")
    return {"peak_gpu_bytes": peak, "bytes_limit": limit}


def _timed(fn, repeats):
    """(compile_s, times, outputs): a first call, then ``repeats`` timed calls."""
    import jax

    t = time.perf_counter()
    outputs = [jax.block_until_ready(fn())]
    compile_s = time.perf_counter() - t
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        outputs.append(jax.block_until_ready(fn()))
        times.append(time.perf_counter() - t)
    return compile_s, times, outputs


def _summary(compile_s, times) -> dict:
    median = statistics.median(times) if times else None
    return {"compile_s": compile_s, "median_s": median, "times_s": times}


def env() -> dict:
    import jax

    from distpm.parallel import devices

    smi = subprocess.run(
        ["nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader"],
        capture_output=True,
        text=True,
    ) if _has("nvidia-smi") else None  # fmt: skip
    return {
        "jax": jax.__version__,
        "backend": jax.default_backend(),
        "devices": [str(d) for d in jax.devices()],
        "gpu": smi.stdout.strip() if smi and smi.returncode == 0 else None,
        "deterministic": devices.is_deterministic(),
        "xla_python_client_mem_fraction": os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"),
        **_memory(),
    }


def _has(program) -> bool:
    import shutil

    return shutil.which(program) is not None


def problem(n, mode="forward", mesh_factor=1, repeats=3, steps=10, seed=0) -> dict:
    """distpm's standard problem: noise -> density (forward), or the gradient of sum(delta^2)
    with respect to the noise; whether the repeats are bitwise equal."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    import distpm
    from distpm.parallel import devices

    cfg = _config(n, mesh_factor, box=256.0, steps=steps)  # as pmwd_problem.py
    cosmo = jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), distpm.Cosmology.planck18())

    def forward(noise, cosmo):
        return distpm.density(distpm.simulate(noise, cosmo, cfg), cfg)

    def loss(noise, cosmo):
        return jnp.sum(forward(noise, cosmo) ** 2)

    fn = jax.jit(forward if mode == "forward" else jax.grad(loss))
    noise = jax.block_until_ready(distpm.white_noise(seed, cfg))
    compile_s, times, outputs = _timed(lambda: fn(noise, cosmo), repeats)
    first = np.asarray(outputs[0])
    same = all(np.array_equal(np.asarray(o), first) for o in outputs[1:])
    return {
        "code": "distpm",
        **_summary(compile_s, times),
        "per_step_ms": None if not times else 1e3 * statistics.median(times) / steps,
        "bitwise_repeats": bool(same),  # the first call's output and every repeat's
        "finite": bool(np.all(np.isfinite(first))),
        "deterministic": devices.is_deterministic(),
        **_memory(),
    }


def plan(n, mesh_factor=1, steps=10) -> dict:
    """distpm's plan of a run (its programs' peak per device), then the run's measured peak:
    its initial conditions and steps, by ``distpm run``'s own loop."""
    import jax

    import distpm
    from distpm import pipeline
    from distpm import plan as planning
    from distpm.parallel import targets

    cfg = _config(n, mesh_factor, steps=steps)
    cosmo = distpm.Cosmology.planck18()
    planned = planning.memory_plan(cosmo, cfg)
    # the same plan compiled without the card (distpm plan --target), for the card it describes
    card = targets.of_device(jax.devices()[0].device_kind)
    deviceless = None
    if card is not None:
        try:
            grid = planning.Decomposition.of(cfg).grid
            deviceless = planning.memory_plan(cosmo, cfg.on(grid), target=card)["peak_bytes"]
        except Exception as err:  # noqa: BLE001 (recorded: the check goes on)
            deviceless = f"{type(err).__name__}: {err}"
    for _, state, _, _ in pipeline.evolve_with_progress(cosmo, cfg, progress=False):
        jax.block_until_ready(state)
    measured = _memory()
    peak = measured["peak_gpu_bytes"]
    return {
        "planned_bytes": planned["peak_bytes"],
        "programs": {k: v["total_bytes"] for k, v in planned["programs"].items()},
        **measured,
        "planned_over_measured": None if not peak else planned["peak_bytes"] / peak,
        "target": card,
        "deviceless_planned_bytes": deviceless,
        "deviceless_over_measured": (
            deviceless / peak if peak and isinstance(deviceless, int) else None
        ),
    }


def halos(n, repeats=3, points=None) -> dict:
    """FoF (b = 0.2, 20 members) + catalogue, kNN (k = 8) and the Morton sort of a run's
    final particles; the positions are written to ``points`` (.npy) for jz-tree."""
    import jax
    import numpy as np

    import distpm

    cfg = _config(n)
    cosmo = distpm.Cosmology.planck18()
    run = jax.block_until_ready(distpm.simulate(distpm.white_noise(0, cfg), cosmo, cfg))
    out = {"n_points": cfg.n_particles, "box": cfg.box_size[0]}

    def fof_catalogue():
        labels = distpm.fof(run, cfg)
        return distpm.halo_catalogue(run, labels, cosmo, cfg).mass

    for name, fn in {
        "fof": lambda: distpm.fof(run, cfg),
        "fof_catalogue": fof_catalogue,
        "knn": lambda: distpm.knn(run, 8, cfg)[0],
        "morton": lambda: distpm.morton_sort(run, cfg)[1],
    }.items():
        compile_s, times, outputs = _timed(fn, repeats)
        out[name] = _summary(compile_s, times)
    labels = np.asarray(distpm.fof(run, cfg, min_members=2))
    mask = np.asarray(run.mask)
    labels = labels[mask]
    out["n_groups_2"] = len(np.unique(labels[labels[:, 0] >= 0], axis=0))  # >= 2 members
    d = np.asarray(distpm.knn(run, 8, cfg)[0])[mask]
    out["mean_kth_distance"] = float(np.mean(d[:, -1]))
    if points:
        np.save(points, np.asarray(run.pos)[mask])
    out.update(_memory())
    return out


def lightcone(n, repeats=3, box=None, z_source=0.5) -> dict:
    """The whole run with and without recording the lightcone (HEALPix nside 256, sources at
    ``z_source``, the observer at the centre; box [Mpc/h], default 8 Mpc/h per particle, as
    ``benchmarks/lightcone.py``): the overhead of recording."""
    import jax

    import distpm
    from distpm.lightcone import LightconeConfig
    from distpm.lightcone.run import lightcone as record_run

    cfg = dataclasses.replace(_config(n), box_size=box or 8.0 * n)
    cosmo = distpm.Cosmology.planck18()
    lc = LightconeConfig(source_redshifts=(z_source,), nside=256)
    noise = jax.block_until_ready(distpm.white_noise(0, cfg))
    plain = jax.jit(lambda x: distpm.simulate(x, cosmo, cfg).pos)
    recorded = jax.jit(lambda x: record_run(x, cosmo, cfg, lc)[0])
    c0, t0, _ = _timed(lambda: plain(noise), repeats)
    c1, t1, _ = _timed(lambda: recorded(noise), repeats)
    out = {"plain": _summary(c0, t0), "recording": _summary(c1, t1)}
    if t0 and t1:
        out["overhead"] = statistics.median(t1) / statistics.median(t0) - 1
    return out


def reference(n, path) -> dict:
    """White noise, final density and final positions (in Lagrangian order: the same rows on
    every platform) of seed 0 on this platform, saved to ``path`` (.npz)."""
    import jax
    import numpy as np

    import distpm
    from distpm.state import linear_ids

    cfg = _config(n)
    noise = distpm.white_noise(0, cfg)
    run = distpm.simulate(noise, distpm.Cosmology.planck18(), cfg)
    mask = np.asarray(run.mask)
    order = np.argsort(linear_ids(np.asarray(run.ids)[mask], cfg.particle_shape))
    np.savez(
        path,
        noise=np.asarray(noise),
        density=np.asarray(distpm.density(run, cfg)),
        pos=np.asarray(run.pos)[mask][order],
    )
    return {"platform": jax.default_backend()}


def fof_labels(n, positions, out) -> dict:
    """FoF labels (smallest row index of each group) of the positions that :func:`reference`
    saved in ``positions``, saved to ``out`` (.npy)."""
    import jax
    import numpy as np

    import distpm

    labels = distpm.fof_points(np.load(positions)["pos"], _config(n), min_members=2)
    np.save(out, labels)
    return {"platform": jax.default_backend(), "groups": int(np.sum(labels == np.arange(n**3)))}


def compare(gpu, cpu, gpu_labels, cpu_labels) -> dict:
    """The two platforms' :func:`reference` and :func:`fof_labels` files: white noise bitwise,
    final density to 1e-5 of its largest value, FoF labels of the same positions equal."""
    import numpy as np

    a, b = np.load(gpu), np.load(cpu)
    scale = float(np.max(np.abs(b["density"])))
    return {
        "noise_bitwise": bool(np.array_equal(a["noise"], b["noise"])),
        "density_max_rel_diff": float(np.max(np.abs(a["density"] - b["density"])) / scale),
        "fof_labels_equal": bool(np.array_equal(np.load(gpu_labels), np.load(cpu_labels))),
    }


STEPS = {
    f.__name__: f for f in (env, problem, plan, halos, lightcone, reference, fof_labels, compare)
}

if __name__ == "__main__":
    name, options = sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}
    print(json.dumps(STEPS[name](**options)), flush=True)
