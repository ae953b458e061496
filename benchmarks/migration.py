"""Migration through the neighbours first: bytes per step, fallbacks and results.

128^3 particles on a 128^3 mesh in 512 Mpc/h (the scaling benchmark's 128^3
case), 10 steps from a = 0.1 (2LPT) to 1, on a 4x2 grid of emulated CPU
devices, run twice from the same initial conditions:

- ``neighbour_factor = 0``: every migration stage takes the full exchange,
  p buckets of ``exchange_factor`` x N/P slots through ``all_to_all`` (the
  migration before the neighbours-first exchange);
- the default ``neighbour_factor``: a stage first sends to the next and
  previous device only (``ppermute``), and takes the full exchange when a
  particle goes further or more leave towards one neighbour than fit.

For each it records the collectives of the compiled step (``hlo.py``; per
device, by role), XLA's memory of the in-place step, the time of every step
(emulated devices share 2 cores: this is the work of the migration, not the
speed of links) and whether the final particles are bitwise the same. Which
stages took the full exchange is replayed on the host from where each
particle was before a step and where it is after it (slot -> device), with
the rule of :func:`distpm.parallel.migrate.stage`.

    python benchmarks/migration.py            # ~1 min on 2 cores
    python benchmarks/migration.py --n 64     # quick check
"""

import os

os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
).strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from hlo import collective_ops, summarise  # noqa: E402
from timing import measured_on, provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm import simulation  # noqa: E402
from distpm.nbody import Schedule  # noqa: E402
from distpm.parallel.decomposition import Decomposition  # noqa: E402
from distpm.plan import memory_per_device  # noqa: E402
from distpm.state import linear_ids  # noqa: E402

COSMO = distpm.Cosmology.planck18()
GRID = (4, 2)
MIB = 2.0**20


def devices_by_id(state, cfg):
    """Device index of every particle, in Lagrangian (id) order."""
    mask = np.asarray(state.mask)
    device = (np.arange(mask.size) // Decomposition.of(cfg).capacity)[mask]
    ids = linear_ids(np.asarray(state.ids)[mask], cfg.particle_shape)
    return device[np.argsort(ids)]


def replay_stages(src, dst, cfg) -> list[dict]:
    """The migration stages of one step, from each particle's device before and after it.

    Along x every device (sx, sy) sends to (dx, sy); then along y from
    (dx, sy) to (dx, dy). A stage falls back to the full exchange when a
    particle goes further than the next or previous device, or when a device
    sends more than ``neighbour_size`` to one of them.
    """
    px, py = Decomposition.of(cfg).grid
    sx, sy, dx, dy = src // py, src % py, dst // py, dst % py
    out = []
    for p, sender, me, to in ((px, sx * py + sy, sx, dx), (py, dx * py + sy, sy, dy)):
        if p == 1:
            continue
        step = (to - me) % p
        leaving = step != 0
        far = leaving & (step != 1) & (step != p - 1)
        direction = np.where(step == 1, 0, 1)  # on 2 devices both neighbours are one
        counts = np.bincount((sender * 2 + direction)[leaving & ~far], minlength=2 * px * py)
        size = Decomposition.of(cfg).neighbour_size
        out.append(
            {
                "leaving": int(leaving.sum()),
                "far": int(far.sum()),
                "largest_to_one_neighbour": int(counts.max()),
                "full_exchange": bool(size is None or far.any() or counts.max() > size),
            }
        )
    return out


def run(cfg, state0, sched) -> dict:
    """Steps from the same state; per-step times, replayed stages, final particles."""
    state, _ = simulation.kick(state0, sched.factors[0, 0], COSMO, cfg)
    steps = sched.kicks()
    state = jax.block_until_ready(state)
    where = devices_by_id(state, cfg)
    times, stages = [], []
    for i, a in enumerate(cfg.time_grid[1:]):
        t = time.perf_counter()
        state, needs = simulation.step(state, steps[i], np.float32(a), COSMO, cfg)
        jax.block_until_ready(state)
        times.append(time.perf_counter() - t)
        distpm.parallel.migrate.check(needs, cfg)
        after = devices_by_id(state, cfg)
        stages.append(replay_stages(where, after, cfg))
        where = after
    return {"times": times, "stages": stages, "state": state}


def compiled_step(cfg, state, sched):
    args = (state, sched.kicks()[0], np.float32(cfg.time_grid[1]), COSMO)
    step = simulation.step.lower(*args, cfg=cfg).compile()
    in_place = simulation.step_in_place.lower(*args, cfg=cfg).compile()
    return step, in_place


def measure(n: int) -> dict:
    base = distpm.SimConfig(mesh_shape=n, box_size=4.0 * n, parallel=GRID)
    state0 = distpm.initial_conditions(distpm.white_noise(0, base), COSMO, base)
    sched = Schedule.of(COSMO, base)
    out = {}
    for name, factor in (
        ("full exchange", 0.0),
        ("neighbours first", base.parallel.neighbour_factor),
    ):
        cfg = base.on(neighbour_factor=factor)
        step, in_place = compiled_step(cfg, state0, sched)
        collectives = summarise(collective_ops(step.as_text(), GRID))
        result = run(cfg, state0, sched)
        out[name] = {
            "neighbour_factor": factor,
            "neighbour_size": Decomposition.of(cfg).neighbour_size,
            "exchange_size": Decomposition.of(cfg).exchange_size,
            "collectives": collectives,
            "memory_in_place": memory_per_device(in_place),
            "step_times_s": result["times"],
            "stages": result["stages"],
            "final": result["state"],
        }
    a, b = (out[k].pop("final") for k in ("full exchange", "neighbours first"))
    same = all(
        np.array_equal(np.asarray(getattr(a, f)), np.asarray(getattr(b, f)))
        for f in ("pos", "vel", "ids", "mask")
    )
    return {"n": n, "grid": list(GRID), "box_size": 4.0 * n, "bitwise_same": same, "runs": out}


def migration_mib(run) -> float:
    roles = run["collectives"]["roles"]
    return sum(roles.get(k, {"bytes": 0})["bytes"] for k in ("migration", "migration (neighbours)"))


def table(res) -> str:
    runs = res["runs"]
    rows = [
        "| migration | slots per neighbour / per destination | migration per step | "
        "all collectives per step | fallback (compiled, not per step) | stages that took "
        "the full exchange | largest to one neighbour | in-place step memory / device | "
        "step time (median) |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in runs.items():
        stages = [s for step in r["stages"] for s in step]
        full = sum(s["full_exchange"] for s in stages)
        largest = max(s["largest_to_one_neighbour"] for s in stages)
        fallback = r["collectives"]["roles"].get("migration (fallback)", {"bytes": 0})["bytes"]
        rows.append(
            f"| {name} | {r['neighbour_size'] or '-'} / {r['exchange_size']} | "
            f"{migration_mib(r) / MIB:.2f} MiB | {r['collectives']['total']['bytes'] / MIB:.2f} MiB"
            f" | {fallback / MIB:.2f} MiB | {full} of {len(stages)} | {largest} | "
            f"{r['memory_in_place']['total_bytes'] / MIB:.1f} MiB | "
            f"{statistics.median(r['step_times_s'][1:]):.3f} s |"
        )
    before, after = (migration_mib(r) for r in runs.values())
    p = res["provenance"]
    rows += [
        "",
        f"{res['n']}^3 particles, {res['box_size']:.0f} Mpc/h, 10 steps from a = 0.1 on "
        f"{res['grid'][0]}x{res['grid'][1]} emulated devices. Migration bytes per step: "
        f"{before / after:.1f}x fewer; final particles bitwise the same: "
        f"{'yes' if res['bitwise_same'] else 'NO'}. Step times exclude the first (compiled) "
        "step; the 8 emulated devices share 2 cores.",
        "",
        measured_on(p),
    ]
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=128)
    args = ap.parse_args()
    res = measure(args.n)
    res["provenance"] = provenance()
    publish(res, table(res), "migration.json", "migration")


if __name__ == "__main__":
    main()
