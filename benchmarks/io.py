"""Snapshot and checkpoint throughput, and the cost of a checkpoint next to a step.

For N^3 particles (mesh N^3, 2LPT state at a=0.1, one process, one CPU
device), after one warm-up call of each: the median over ``--repeats`` of
writing and reading a Gadget-4 snapshot (float32 on disk, read back into
``Particles`` on the device grid), writing and reading a checkpoint (the raw
buffers, synced to disk), and one compiled PM step. Throughput is the bytes
on disk divided by the time, per process (each process writes only its own
particles; nothing is gathered).

Group catalogues (``--groups-n``, default 128^3): the final particles of a
10-step run (256 Mpc/h for 128^3) and their FoF catalogue; the median time of
``write_snapshot`` next to ``write_groups`` (the snapshot sorted into group
order plus the Gadget-4 catalogue), so the ratio is the cost of the order.

Checksums (issue 63): the same buffers as a checkpoint's (pos, vel, ids,
mask) written to HDF5 and read back with and without HDF5's Fletcher32
filter, and the SHA-256 of the file that a checkpoint's COMPLETE record holds
(computed after the write, checked before a resume).

    python benchmarks/io.py                # 128^3 and 256^3, ~7 min on 2 cores
    python benchmarks/io.py --sizes 64     # quick check
"""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")

import argparse  # noqa: E402
import shutil  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

import jax  # noqa: E402
import numpy as np  # noqa: E402
from timing import measured_on, median_time, provenance, publish  # noqa: E402

import distpm  # noqa: E402
from distpm import simulation  # noqa: E402
from distpm.io import checkpoint, checksums, gadget  # noqa: E402
from distpm.nbody import Schedule  # noqa: E402

COSMO = distpm.Cosmology.planck18()


def size_of(path: Path) -> int:
    return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())


def measure(n, repeats, scratch: Path) -> dict:
    cfg = distpm.SimConfig(mesh_shape=n, box_size=2.0 * n, parallel=(1, 1))
    state = jax.block_until_ready(distpm.initial_conditions(distpm.white_noise(0, cfg), COSMO, cfg))
    snap = scratch / f"snap{n}"

    def write():
        shutil.rmtree(snap, ignore_errors=True)
        return gadget.write_snapshot(snap, state, COSMO, cfg)

    write_s, base = median_time(write, repeats)
    snapshot_bytes = size_of(snap)
    read_s, back = median_time(
        lambda: jax.block_until_ready(gadget.read_snapshot(base, cfg)), repeats
    )
    assert back.count == cfg.n_particles
    ckpt = scratch / f"ckpt{n}"
    write_ckpt_s, _ = median_time(
        lambda: checkpoint.write_checkpoint(ckpt, state, 0, COSMO, cfg), repeats
    )
    checkpoint_bytes = size_of(ckpt / checkpoint.DIRECTORY)
    read_ckpt_s, _ = median_time(
        lambda: jax.block_until_ready(checkpoint.read_checkpoint(ckpt, COSMO, cfg)[0]), repeats
    )
    factors = Schedule.of(COSMO, cfg).kicks()
    a_next = np.float32(cfg.time_grid[1])
    compiled = simulation.step.lower(state, factors[0], a_next, COSMO, cfg=cfg).compile()
    step_s, _ = median_time(
        lambda: jax.block_until_ready(compiled(state, factors[0], a_next, COSMO)), repeats
    )
    shutil.rmtree(snap, ignore_errors=True)
    shutil.rmtree(ckpt, ignore_errors=True)
    mb = 1e6
    return {
        "n": n,
        "particles": cfg.n_particles,
        "snapshot_mb": snapshot_bytes / mb,
        "snapshot_write_s": write_s,
        "snapshot_write_mb_s": snapshot_bytes / mb / write_s,
        "snapshot_read_s": read_s,
        "snapshot_read_mb_s": snapshot_bytes / mb / read_s,
        "checkpoint_mb": checkpoint_bytes / mb,
        "checkpoint_write_s": write_ckpt_s,
        "checkpoint_write_mb_s": checkpoint_bytes / mb / write_ckpt_s,
        "checkpoint_read_s": read_ckpt_s,
        "step_s": step_s,
        "checkpoint_over_step": write_ckpt_s / step_s,
    }


def measure_groups(n, repeats, scratch: Path) -> dict:
    cfg = distpm.SimConfig(
        mesh_shape=n,
        box_size=2.0 * n,
        n_steps=10,
        a_start=0.1,
        parallel={"devices": (1, 1), "exchange_factor": 0.3},
    )
    run = jax.block_until_ready(distpm.simulate(distpm.white_noise(0, cfg), COSMO, cfg))
    labels = distpm.fof(run, cfg)
    cat = distpm.halo_catalogue(run, labels, COSMO, cfg)
    out = scratch / f"groups{n}"

    def write(groups):
        shutil.rmtree(out, ignore_errors=True)
        if groups:
            return distpm.io.write_groups(out, run, labels, cat, COSMO, cfg)
        return gadget.write_snapshot(out / "snapdir_000", run, COSMO, cfg)

    snapshot_s, _ = median_time(lambda: write(False), repeats)
    groups_s, _ = median_time(lambda: write(True), repeats)
    catalogue_bytes = size_of(out / "groups_000")
    shutil.rmtree(out, ignore_errors=True)
    return {
        "n": n,
        "groups": len(cat),
        "members": int(cat.n.sum()),
        "snapshot_write_s": snapshot_s,
        "groups_write_s": groups_s,
        "catalogue_mb": catalogue_bytes / 1e6,
        "groups_over_snapshot": groups_s / snapshot_s,
    }


def measure_checksums(n, repeats, scratch: Path) -> dict:
    """Write and read a checkpoint's buffers with and without Fletcher32; SHA-256 of the file."""
    import h5py

    rng = np.random.default_rng(0)
    n3 = n**3
    arrays = {
        "pos": rng.uniform(0, n, (n3, 3)).astype(np.float32),
        "vel": rng.normal(0, 1, (n3, 3)).astype(np.float32),
        "ids": rng.integers(0, n3, (n3, 2)).astype(np.int32),
        "mask": np.ones(n3, bool),
    }
    out = {"n": n}
    for name, options in (("plain", {}), ("fletcher32", {"fletcher32": True})):
        path = scratch / f"checksums_{name}_{n}.h5"

        def write(path=path, options=options):
            with h5py.File(path, "w") as f:
                for field, data in arrays.items():
                    f.create_dataset(field, data=data, **options)

        def read(path=path):
            with h5py.File(path, "r") as f:
                return [np.asarray(f[field]) for field in arrays]

        out[f"{name}_write_s"], _ = median_time(write, repeats)
        out[f"{name}_read_s"], _ = median_time(read, repeats)
        out[f"{name}_mb"] = path.stat().st_size / 1e6
    out["sha256_s"], _ = median_time(lambda: checksums.sha256(path), repeats)
    return out


def checksums_table(rows) -> str:
    lines = [
        "| N | file | write | with Fletcher32 | read | with Fletcher32 | SHA-256 of the file |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']}^3 | {r['plain_mb']:.0f} MB | {r['plain_write_s']:.2f} s | "
            f"{r['fletcher32_write_s']:.2f} s ({r['fletcher32_write_s'] / r['plain_write_s']:.2f}x)"
            f" | {r['plain_read_s']:.2f} s | {r['fletcher32_read_s']:.2f} s "
            f"({r['fletcher32_read_s'] / r['plain_read_s']:.2f}x) | {r['sha256_s']:.2f} s "
            f"({r['fletcher32_mb'] / r['sha256_s']:.0f} MB/s) |"
        )
    return "\n".join(lines)


def groups_table(row) -> str:
    return "\n".join(
        [
            "| particles | groups (members) | write_snapshot | write_groups (sorted snapshot "
            "+ catalogue) | ratio | catalogue |",
            "|---|---|---|---|---|---|",
            f"| {row['n']}^3 | {row['groups']} ({row['members']}) | "
            f"{row['snapshot_write_s']:.2f} s | {row['groups_write_s']:.2f} s | "
            f"{row['groups_over_snapshot']:.2f} | {row['catalogue_mb']:.1f} MB |",
        ]
    )


def table(rows) -> str:
    lines = [
        "| N | snapshot | write | read | checkpoint | write | read | step | checkpoint / step |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['n']}^3 | {r['snapshot_mb']:.0f} MB | {r['snapshot_write_s']:.2f} s "
            f"({r['snapshot_write_mb_s']:.0f} MB/s) | {r['snapshot_read_s']:.2f} s "
            f"({r['snapshot_read_mb_s']:.0f} MB/s) | {r['checkpoint_mb']:.0f} MB | "
            f"{r['checkpoint_write_s']:.2f} s ({r['checkpoint_write_mb_s']:.0f} MB/s) | "
            f"{r['checkpoint_read_s']:.2f} s | {r['step_s']:.2f} s | "
            f"{r['checkpoint_over_step']:.2f} |"
        )
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[128, 256])
    ap.add_argument("--groups-n", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--scratch", help="directory for the files (default: a temporary one)")
    args = ap.parse_args()
    scratch = Path(args.scratch or tempfile.mkdtemp(prefix="distpm_io_"))
    scratch.mkdir(parents=True, exist_ok=True)
    rows = []
    for n in args.sizes:
        rows.append(measure(n, args.repeats, scratch))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    groups = measure_groups(args.groups_n, args.repeats, scratch)
    print(groups_table(groups).splitlines()[-1], flush=True)
    sums = [measure_checksums(n, args.repeats, scratch) for n in args.sizes]
    print(checksums_table(sums), flush=True)
    results = {
        "rows": rows,
        "groups": groups,
        "checksums": sums,
        "repeats": args.repeats,
        "scratch": str(scratch),
        **provenance(),
    }
    text = "\n\n".join([table(rows), groups_table(groups), checksums_table(sums)])
    text += "\n\n" + measured_on(results)
    publish(results, text, "io.json", "io")


if __name__ == "__main__":
    main()
