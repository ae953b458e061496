"""Friends-of-friends, the halo catalogue and the Morton sort, next to scipy's cKDTree.

The final particles of a 128^3, 256 Mpc/h, 10-step run (2LPT at a=0.1,
Planck18), one process on this machine's CPU, device grids 1x1 and 4x2
(emulated: 8 XLA CPU devices sharing the same cores). Each timing is the
median over ``--repeats`` calls after one warm-up call, ended with
``block_until_ready``; distpm and scipy are called in turn, one call each a
round, so that the machine's drifts in speed weigh on both alike:

- distpm: ``fof`` (b = 0.2, 20 members) and ``fof`` + ``halo_catalogue`` (its moments,
  without the spherical-overdensity masses); the M200m and M200c search alone
  (``spherical_overdensity`` around the catalogue's centres, as the catalogue calls it);
  ``morton_sort`` with and without ``balance``;
- scipy (1x1 row only): ``cKDTree(boxsize=L)`` + ``query_pairs`` +
  ``connected_components`` on the same positions (labels only), with a
  check that both give the same groups;
- kNN, k = 8 (1x1, and 2x1: one device per core, as cKDTree's two
  workers): ``distpm.knn`` against ``cKDTree(boxsize=L)`` built and queried
  with ``workers=2``, on the PM particles and on 100^3 uniform points
  (200 Mpc/h box);
- memory (every grid; 2x2: memory only): XLA's memory analysis of the
  compiled FoF and kNN (temporary buffers of one device's program), and
  the same per particle slot of the device's buffer. The slots fall as
  1/P: capacity_factor x N/P (1.5 by default), but N on one device.

    python benchmarks/halos.py               # ~10 min on 2 cores
    python benchmarks/halos.py --n 64        # quick check
"""

import argparse
import json
import math
import os
import subprocess
import sys

from timing import measured_on, median_time, median_times, provenance, publish

GRIDS = ("1x1", "4x2", "2x1", "2x2")  # 2x1: kNN and memory, 2x2: memory only


def measure(n, grid, repeats) -> dict:
    import jax
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components
    from scipy.spatial import cKDTree

    import distpm
    from distpm.analysis import fof as fof_module
    from distpm.analysis import overdensity

    devices = tuple(int(x) for x in grid.split("x"))
    box = 2.0 * n
    cfg = distpm.SimConfig(
        mesh_shape=n,
        box_size=box,
        n_steps=10,
        a_start=0.1,
        parallel={"devices": devices, "exchange_factor": 0.3},
    )
    cosmo = distpm.Cosmology.planck18()
    run = jax.block_until_ready(distpm.simulate(distpm.white_noise(0, cfg), cosmo, cfg))
    row = {"n": n, "grid": grid, **_memory(run, cfg)}
    if grid == "2x2":
        return row
    if grid == "2x1":
        pos = np.mod(run.by_id("pos").astype(np.float64), box)
        return {**row, **_knn_timings(run, pos, cfg, box, repeats)}

    row["fof_s"], labels = median_time(lambda: jax.block_until_ready(distpm.fof(run, cfg)), repeats)

    def catalogue():  # its moments only: the same problem as before the overdensity masses
        return distpm.halo_catalogue(run, distpm.fof(run, cfg), cosmo, cfg, so_masses=False)

    if grid != "1x1":
        row["fof_catalogue_s"], cat = median_time(catalogue, repeats)
    for balance in (False, True):
        row[f"morton{'_balanced' if balance else ''}_s"], _ = median_time(
            lambda b=balance: jax.block_until_ready(distpm.morton_sort(run, cfg, balance=b)),
            repeats,
        )
    if grid == "1x1":
        pos = np.mod(run.by_id("pos").astype(np.float64), box)
        distance = fof_module.linking_distance(cfg, 0.2)

        def scipy_labels():
            pairs = cKDTree(pos, boxsize=box).query_pairs(distance, output_type="ndarray")
            graph = coo_matrix((np.ones(len(pairs)), pairs.T), shape=(len(pos),) * 2)
            return connected_components(graph, directed=False)[1]

        times, (cat, comp) = median_times([catalogue, scipy_labels], repeats)
        row["fof_catalogue_s"], row["scipy_s"] = times
        mask = np.asarray(run.mask)
        ids = distpm.state.linear_ids(np.asarray(run.ids)[mask], cfg.particle_shape)
        ours = np.asarray(labels)[mask][np.argsort(ids)]
        sizes = np.bincount(comp)
        smallest = np.full(comp.max() + 1, len(pos))
        np.minimum.at(smallest, comp, np.arange(len(pos)))
        want = np.where(sizes[comp] >= 20, smallest[comp], -1)
        got = np.where(ours[:, 0] >= 0, distpm.state.linear_ids(ours, cfg.particle_shape), -1)
        row["same_groups_as_scipy"] = bool(np.array_equal(got.astype(np.int64), want))
        row.update(_knn_timings(run, pos, cfg, box, repeats))
    row["groups"] = len(cat)
    search = overdensity.search_radius(cat.n, cfg)
    row["so_s"], _ = median_time(
        lambda: distpm.spherical_overdensity(run, cat.pos, search, cosmo, cfg), repeats
    )
    return row


def _memory(run, cfg) -> dict:
    """[MiB] XLA's temporary memory of one device's FoF and kNN (k = 8) programs, and the
    particle slots per device."""
    from distpm.analysis import fof as fof_module
    from distpm.analysis import knn_cells, neighbours
    from distpm.parallel.decomposition import Decomposition

    out = {"slots": Decomposition.of(cfg).capacity}
    compiled = fof_module._fof_particles.lower(run, cfg, fof_module.FoFOptions()).compile()
    out["fof_temp_mib"] = compiled.memory_analysis().temp_size_in_bytes / 2**20
    steps = knn_cells.radii(cfg, 8, None)
    compiled = neighbours._knn.lower(run, cfg, 8, steps, None, 2.0).compile()
    out["knn_temp_mib"] = compiled.memory_analysis().temp_size_in_bytes / 2**20
    return out


def _knn_timings(run, pos, cfg, box, repeats) -> dict:
    """kNN (k = 8) of the run's particles and of 100^3 uniform points, distpm vs cKDTree."""
    import jax
    import numpy as np
    from scipy.spatial import cKDTree

    import distpm
    from distpm.parallel.decomposition import Decomposition

    def tree(x, size):
        return lambda: cKDTree(x, boxsize=size).query(x, 9, workers=2)

    out = {}
    ours = lambda: jax.block_until_ready(distpm.knn(run, 8, cfg))  # noqa: E731
    (out["knn_pm_s"], out["knn_pm_scipy_s"]), _ = median_times([ours, tree(pos, box)], repeats)
    n, size = 100, 200.0
    points = np.random.default_rng(0).uniform(0, size, (n**3, 3)).astype(np.float32)
    uniform = distpm.SimConfig(
        mesh_shape=n,
        box_size=size,
        parallel={"devices": Decomposition.of(cfg).grid, "capacity_factor": 1.2},
    )
    particles = distpm.shares.from_positions(points, uniform)  # ids: the row indices
    ours = lambda: jax.block_until_ready(distpm.knn(particles, 8, uniform))  # noqa: E731
    theirs = tree(points.astype(np.float64), size)
    (out["knn_uniform_s"], out["knn_uniform_scipy_s"]), _ = median_times([ours, theirs], repeats)
    return out


def table(rows) -> str:
    lines = [
        "| particles | grid | FoF | FoF + catalogue | scipy (labels) | ratio | groups (>= 20) "
        "| M200m, M200c | Morton sort | + balance |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in (r for r in rows if "fof_s" in r):
        scipy = f"{r['scipy_s']:.2f} s" if "scipy_s" in r else "-"
        ratio = f"{r['fof_catalogue_s'] / r['scipy_s']:.2f}" if "scipy_s" in r else "-"
        lines.append(
            f"| {r['n']}^3 | {r['grid']} | {r['fof_s']:.2f} s | {r['fof_catalogue_s']:.2f} s | "
            f"{scipy} | {ratio} | {r['groups']} | {r.get('so_s', math.nan):.2f} s | "
            f"{r['morton_s']:.2f} s | "
            f"{r['morton_balanced_s']:.2f} s |"
        )
    lines += [
        "",
        "| memory per device | grid | slots | FoF temp. | per slot | kNN temp. | per slot |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        fof, knn = (r[f"{name}_temp_mib"] for name in ("fof", "knn"))
        lines.append(
            f"| {r['n']}^3 PM particles | {r['grid']} | {r['slots']} | {fof:.0f} MiB | "
            f"{fof * 2**20 / r['slots']:.0f} B | {knn:.0f} MiB | {knn * 2**20 / r['slots']:.0f} B |"
        )
    knn = [r for r in rows if "knn_pm_s" in r]
    if knn:
        lines += [
            "",
            "| kNN, k = 8 | grid | distpm | cKDTree, workers=2 | ratio |",
            "|---|---|---|---|---|",
        ]
    for r in knn:
        for name, label in (("pm", f"{r['n']}^3 PM particles"), ("uniform", "100^3 uniform")):
            ours, theirs = r[f"knn_{name}_s"], r[f"knn_{name}_scipy_s"]
            lines.append(
                f"| {label} | {r['grid']} | {ours:.2f} s | {theirs:.2f} s | {ours / theirs:.2f} |"
            )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--one", help=argparse.SUPPRESS)  # a grid, measured in this process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure(args.n, args.one, args.repeats)), flush=True)
        return
    rows = []
    for grid in GRIDS:
        env = {**os.environ, "JAX_PLATFORMS": "cpu"}
        if grid != "1x1":
            count = math.prod(int(x) for x in grid.split("x"))
            env["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={count}"
        cmd = [sys.executable, __file__, "--n", str(args.n), "--repeats", str(args.repeats)]
        out = subprocess.run([*cmd, "--one", grid], env=env, capture_output=True, text=True)
        if out.returncode:
            sys.exit(out.stderr)
        rows.append(json.loads(out.stdout.splitlines()[-1]))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    results = {
        "rows": rows,
        "repeats": args.repeats,
        **provenance(),
    }
    publish(results, table(rows) + "\n\n" + measured_on(results), "halos.json", "halos")


if __name__ == "__main__":
    main()
