"""The cost of recording the lightcone, next to a PM step without it.

One run (N^3 particles and mesh, box L, from a_start to a = 1 in
``--steps`` steps, sources at z_s = ``--z-source``); at every step, the
median over ``--repeats`` calls of the plain compiled step and of the same
step recording the lightcone (crossings, Born weights, painting), both from
the same state, after a warm-up call of each. The overhead is
sum(recording) / sum(plain) - 1 over the run; the steps far from the
observer, whose shells meet more box replicas, cost the most (max ratio).
Maps: HEALPix nside 256 and 512, a flat 10 x 10 degree map of 1024^2 pixels;
device grids 1x1 and 4x2 (8 emulated CPU devices on this machine's cores).

    python benchmarks/lightcone.py                   # 128^3, 1024 Mpc/h, z_s = 0.5
    python benchmarks/lightcone.py --n 64 --box 256 --steps 5   # quick check
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
from timing import provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm import simulation  # noqa: E402
from distpm.lightcone import (
    LightconeConfig,  # noqa: E402
    LightconeObserver,  # noqa: E402
    record,  # noqa: E402
)
from distpm.nbody import Schedule  # noqa: E402

COSMO = distpm.Cosmology.planck18()
MAPS = {
    "nside 256": dict(nside=256),
    "nside 512": dict(nside=512),
    "flat 1024^2": dict(flat_fov=10.0, flat_pixels=1024),
}


def _median(fn, repeats):
    jax.block_until_ready(fn())  # warm-up (compiles on the first step)
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn())
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def measure(args, maps_name, grid) -> dict:
    cfg = distpm.SimConfig(
        box_size=args.box,
        mesh_shape=args.n,
        a_start=args.a_start,
        n_steps=args.steps,
        parallel=grid,
    )
    lc = LightconeConfig(source_redshifts=(args.z_source,), **MAPS[maps_name])
    noise = distpm.white_noise(0, cfg)
    sched = Schedule.of(COSMO, cfg)
    state = simulation.kick(
        distpm.initial_conditions(noise, COSMO, cfg), sched.factors[0, 0], COSMO, cfg
    )[0]
    factors = sched.kicks()
    observers = (LightconeObserver.of(COSMO, cfg, lc),)
    maps = simulation.empty_records(observers, cfg)
    a_next = np.asarray(cfg.time_grid[1:], dtype=np.float32)
    plain, with_lc, crossings = [], [], []
    for i in range(len(a_next)):
        step_args = (factors[i], a_next[i], COSMO)

        def plain_step(state=state, step_args=step_args):
            return simulation.step(state, *step_args, cfg)

        def recording_step(state=state, step_args=step_args, i=i):
            return simulation.step(
                state, *step_args, cfg, observers=observers, records=maps, step=i
            )

        plain.append(_median(plain_step, args.repeats))
        with_lc.append(_median(recording_step, args.repeats))
        (seen,) = recording_step()[1]  # column 0 of each raw map: the crossings painted into it
        crossings.append(float(sum(np.asarray(m)[..., 0].sum() for m in seen.values())))
        state = jax.block_until_ready(plain_step()[0])
        print(f"  {maps_name} {grid} step {i}: {plain[-1]:.3f} s, {with_lc[-1]:.3f} s, "
              f"{crossings[-1]:.3g} crossings", flush=True)  # fmt: skip
    bare = bare_ns_per_crossing(maps_name, lc, cfg, state)
    ratios = np.array(with_lc) / np.array(plain)
    extra = sum(with_lc) - sum(plain)
    return {
        "maps": maps_name,
        "grid": grid,
        "plain_step_s": plain,
        "recording_step_s": with_lc,
        "crossings": crossings,
        "overhead": sum(with_lc) / sum(plain) - 1,
        "max_step_ratio": float(ratios.max()),
        "crossings_per_particle_step": sum(crossings) / (len(plain) * args.n**3),
        "extra_ns_per_crossing": 1e9 * extra / max(sum(crossings), 1.0),
        "plain_ns_per_particle_step": 1e9 * sum(plain) / (len(plain) * args.n**3),
        "replicas": int(len(record.Recorder(lc, cfg).tiles)),
        "bare_ns_per_crossing": bare,
    }


def bare_ns_per_crossing(maps_name, lc, cfg, state, repeats=5) -> float:
    """[ns] What XLA itself needs to paint one crossing on this machine: the two arctangents
    of its direction and the bare scatter-add of its map updates (4 pixels x (count + one
    source)). Measured on the directions of the run's particles from the observer, in their
    buffer order, so that the pixels they hit are as local as a step's crossings; one device,
    the pixels computed beforehand."""
    device = jax.devices()[0]
    mask = np.asarray(state.mask)
    r = np.asarray(state.pos)[mask] - lc.observer_position(cfg)
    r = jax.device_put(r.astype(np.float32), device)
    rec = record.Recorder(lc, cfg)
    kind = "healpix" if lc.nside is not None else "flat"
    pix, weights = (jnp.stack(c, -1) for c in jax.jit(lambda r: rec._pixels(kind, r))(r))
    n_pixels = rec.n_pixels[kind]
    values = jax.device_put(np.ones((1, 1, 2), np.float32), device) * weights[..., None]
    maps = jax.device_put(np.zeros((n_pixels, 2), np.float32), device)  # pixel-major, as a run's

    @jax.jit
    def paint(maps, r, pix, values):
        rho = jnp.sqrt(r[:, 0] ** 2 + r[:, 1] ** 2)
        angles = jnp.arctan2(rho, r[:, 2]) + jnp.arctan2(r[:, 1], r[:, 0])
        return maps.at[pix].add(values * angles[:, None, None], mode="drop")

    return 1e9 * _median(lambda: paint(maps, r, pix, values), repeats) / r.shape[0]


def table(rows, args) -> str:
    lines = [
        f"{args.n}^3 particles, {args.box:g} Mpc/h, {args.steps} steps from a = {args.a_start}, "
        f"z_s = {args.z_source}; medians of {args.repeats} per step",
        "",
        "| maps | devices | plain steps [s] | recording steps [s] | overhead | worst step "
        "| crossings per particle-step | ns per crossing | XLA's bare ns per crossing | ratio "
        "| ns per particle-step |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['maps']} | {r['grid']} | {sum(r['plain_step_s']):.2f} | "
            f"{sum(r['recording_step_s']):.2f} | {100 * r['overhead']:.0f}% | "
            f"{r['max_step_ratio']:.2f}x | {r['crossings_per_particle_step']:.3f} | "
            f"{r['extra_ns_per_crossing']:.0f} | {r['bare_ns_per_crossing']:.0f} | "
            f"{r['extra_ns_per_crossing'] / r['bare_ns_per_crossing']:.1f}x | "
            f"{r['plain_ns_per_particle_step']:.0f} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--box", type=float, default=1024.0)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--a-start", type=float, default=0.5)
    ap.add_argument("--z-source", type=float, default=0.5)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--maps", nargs="+", default=list(MAPS))
    ap.add_argument("--grids", nargs="+", default=["1x1", "4x2"])
    args = ap.parse_args()
    rows = []
    for name in args.maps:
        for grid in args.grids:
            rows.append(measure(args, name, grid))
            print(table(rows[-1:], args).splitlines()[-1], flush=True)
    results = {"rows": rows, "args": vars(args), **provenance()}
    publish(results, table(rows, args), "lightcone.json", "lightcone")


if __name__ == "__main__":
    main()
