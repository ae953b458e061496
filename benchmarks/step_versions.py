"""One PM step on one CPU device, this checkout against an earlier version, side by side.

For each version (a git revision, checked out in a temporary worktree; the
default compares the working tree with ``--base``), a fresh process runs
128^3 particles on a 128^3 mesh in 512 Mpc/h from 2LPT at a = 0.1 and
measures, after a warm-up, the median over ``--repeats`` calls of

- the forward step (``simulation.step``),
- the gradient of sum(vel^2) after one step with respect to the positions
  before it (the force, its VJP and the step's own VJP),

each call ended with ``jax.block_until_ready``, and XLA's memory per
particle of the in-place step (``step_in_place``). The versions alternate,
``--rounds`` times, and the table gives the median of the rounds.

The floor of a step on this machine, measured in the same run: the four
FFTs of the force (one real-to-complex transform of the density, one
complex-to-real of the 3-component force) plus one pass that reads and
writes the particles (the kick and drift).

    python benchmarks/step_versions.py                 # ~3 min on 2 cores
    python benchmarks/step_versions.py --base f33fc90 --rounds 3
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from timing import HERE, measured_on, provenance, publish

REPO = HERE.parent
N = 128


def measure(repeats: int) -> dict:
    """One version, in this process (its ``distpm`` is on sys.path)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from timing import median_time

    import distpm
    from distpm import simulation

    cosmo = distpm.Cosmology.planck18()
    cfg = distpm.SimConfig(mesh_shape=N, box_size=4.0 * N, parallel=(1, 1))
    state = distpm.initial_conditions(distpm.white_noise(0, cfg), cosmo, cfg)
    if hasattr(simulation, "empty_records"):  # since 2026-11-27: the Schedule
        from distpm.nbody import Schedule

        sched = Schedule.of(cosmo, cfg)
        state, _ = simulation.kick(state, sched.factors[0, 0], cosmo, cfg)
        factors = sched.kicks()[0]
    elif hasattr(simulation, "kick"):  # merged kicks: the state carries no force
        from distpm import integrate

        factors = integrate.step_factors(cosmo, cfg)
        state, _ = simulation.kick(state, factors[0, 0], cosmo, cfg)
        factors = integrate.merged_kicks(factors)[0]
    else:  # before 2026-11-25: the state carries the force
        from distpm import integrate

        state, _ = simulation.with_force(state, cosmo, cfg)
        factors = integrate.step_factors(cosmo, cfg)[0]
    a = np.float32(cfg.time_grid[1])

    def forward():
        return jax.block_until_ready(simulation.step(state, factors, a, cosmo, cfg))

    def loss(pos):
        moved, _ = simulation.step(state.replace(pos=pos), factors, a, cosmo, cfg)
        return jnp.sum(moved.vel**2)

    grad = jax.jit(jax.grad(loss))
    step_s, _ = median_time(forward, repeats)
    grad_s, _ = median_time(lambda: jax.block_until_ready(grad(state.pos)), repeats)
    compiled = simulation.step_in_place.lower(state, factors, a, cosmo, cfg=cfg).compile()
    m = compiled.memory_analysis()
    total = m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
    total -= m.alias_size_in_bytes
    return {"step_s": step_s, "grad_s": grad_s, "bytes_per_particle": total / N**3}


def floor(repeats: int) -> dict:
    """The FFTs of one force and one read-write pass over the particles, timed apart."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from timing import median_time

    rng = np.random.default_rng(0)
    real = jnp.asarray(rng.normal(size=(N, N, N)).astype(np.float32))
    modes = jnp.fft.rfftn(real)
    three = jnp.stack([modes] * 3, axis=-1)
    pos, vel, acc = (jnp.asarray(rng.normal(size=(N**3, 3)).astype(np.float32)) for _ in "pva")
    rfft = jax.jit(jnp.fft.rfftn)
    irfft = jax.jit(lambda x: jnp.fft.irfftn(x, s=(N, N, N), axes=(0, 1, 2)))
    kick_drift = jax.jit(lambda p, v, f: (jnp.mod(p + 0.1 * (v + 0.2 * f), 512.0), v + 0.2 * f))
    parts = {
        "rfft_s": median_time(lambda: jax.block_until_ready(rfft(real)), repeats)[0],
        "irfft_3_s": median_time(lambda: jax.block_until_ready(irfft(three)), repeats)[0],
        "particles_s": median_time(
            lambda: jax.block_until_ready(kick_drift(pos, vel, acc)), repeats
        )[0],
    }
    parts["floor_s"] = sum(parts.values())
    parts.update(mass_assignment_primitives(repeats))
    return parts


def mass_assignment_primitives(repeats: int) -> dict:
    """XLA's bare CIC primitives on this CPU, the least paint and readout can cost as written
    in XLA: one scatter-add of every particle's 2x2x2 weights into the mesh, and the 8
    gathers of one field component at every particle, times 3 (a lattice displaced by
    N(0, 1.5) cells, in lattice order, as a run's particles are on one device)."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from timing import median_time

    rng = np.random.default_rng(0)
    lattice = np.stack(np.meshgrid(*[np.arange(N)] * 3, indexing="ij"), -1).reshape(-1, 3)
    cells = jnp.asarray((lattice + rng.normal(0, 1.5, lattice.shape)) % N, jnp.float32)
    field = jnp.asarray(rng.normal(size=(N + 1,) * 3).astype(np.float32))

    def stencil(x):
        first = jnp.floor(x)
        d = x - first
        return first.astype(jnp.int32), [jnp.stack([1 - d[:, a], d[:, a]], -1) for a in range(3)]

    @jax.jit
    def scatter(x):
        first, (wx, wy, wz) = stencil(x)
        blocks = wx[:, :, None, None] * wy[:, None, :, None] * wz[:, None, None, :]
        dims = lax.ScatterDimensionNumbers((1, 2, 3), (), (0, 1, 2))
        return lax.scatter_add(jnp.zeros((N + 1,) * 3), first, blocks, dims)

    @jax.jit
    def gathers(field, x):
        first, w = stencil(x)
        flat, out = field.reshape(-1), 0.0
        for corner in np.ndindex(2, 2, 2):
            node = [first[:, a] + corner[a] for a in range(3)]
            weight = w[0][:, corner[0]] * w[1][:, corner[1]] * w[2][:, corner[2]]
            out = out + weight * flat[(node[0] * (N + 1) + node[1]) * (N + 1) + node[2]]
        return out

    gather_s = median_time(lambda: jax.block_until_ready(gathers(field, cells)), repeats)[0]
    return {
        "cic_scatter_s": median_time(lambda: jax.block_until_ready(scatter(cells)), repeats)[0],
        "cic_gather_3_s": 3 * gather_s,
    }


def worktree(rev: str, scratch: Path) -> Path:
    """A checkout of ``rev`` (None: this working tree)."""
    if rev is None:
        return REPO
    path = scratch / rev
    if not path.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(path), rev], cwd=REPO, check=True)
    return path


def run_version(tree: Path, repeats: int, what: str) -> dict:
    code = (
        f"import sys; sys.path[:0] = [{str(tree / 'src')!r}, {str(HERE)!r}]; "
        f"import json, step_versions as s; print(json.dumps(s.{what}({repeats})))"
    )
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}  # one device
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**env, "JAX_PLATFORMS": "cpu"},
    )
    if out.returncode:
        sys.exit(out.stderr)
    return json.loads(out.stdout.splitlines()[-1])


def table(res) -> str:
    rows = [
        "| version | step (median) | gradient of a step (median) | in-place step memory |",
        "|---|---|---|---|",
    ]
    med = {}
    for name in res["versions"]:
        rounds = res["rounds"][name]
        med[name] = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
        m = med[name]
        rows.append(
            f"| {name} | {m['step_s']:.3f} s | {m['grad_s']:.3f} s | "
            f"{m['bytes_per_particle']:.0f} B/particle |"
        )
    base, new = (med[k] for k in res["versions"])
    f = res["floor"]
    p = res["provenance"]
    rows += [
        "",
        f"{N}^3 particles and mesh, 512 Mpc/h, one CPU device; medians of "
        f"{len(res['rounds'][res['versions'][0]])} alternating rounds, each a median of "
        f"{res['repeats']} calls after a warm-up. Ratio new/old: step "
        f"{new['step_s'] / base['step_s']:.2f}, gradient {new['grad_s'] / base['grad_s']:.2f}, "
        f"memory {new['bytes_per_particle'] / base['bytes_per_particle']:.2f}.",
        "",
        f"Floor of a step: rfft {f['rfft_s']:.3f} s + irfft of 3 components "
        f"{f['irfft_3_s']:.3f} s + one read-write pass over the particles "
        f"{f['particles_s']:.3f} s = {f['floor_s']:.3f} s; the step takes "
        f"{new['step_s'] / f['floor_s']:.1f}x the floor.",
        "",
        f"XLA's bare CIC primitives on this CPU (the least paint and readout cost as XLA "
        f"emits them): one scatter-add of every particle's 2x2x2 weights "
        f"{f['cic_scatter_s']:.3f} s, the 8 gathers of 3 force components "
        f"{f['cic_gather_3_s']:.3f} s; with the floor that is "
        f"{(f['floor_s'] + f['cic_scatter_s'] + f['cic_gather_3_s']) / f['floor_s']:.1f}x the "
        f"floor before any other work.",
        "",
        measured_on(p),
    ]
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default="f33fc90", help="the earlier version (a git revision)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    versions = {f"{args.base} (before)": args.base, "this checkout": None}
    with tempfile.TemporaryDirectory(prefix="distpm_versions_") as scratch:
        trees = {name: worktree(rev, Path(scratch)) for name, rev in versions.items()}
        rounds = {name: [] for name in versions}
        for _ in range(args.rounds):
            for name, tree in trees.items():
                rounds[name].append(run_version(tree, args.repeats, "measure"))
                print(name, rounds[name][-1], flush=True)
        for name, rev in versions.items():
            if rev is not None:
                subprocess.run(["git", "worktree", "remove", "--force", str(trees[name])], cwd=REPO)
    res = {
        "versions": list(versions),
        "rounds": rounds,
        "repeats": args.repeats,
        "floor": run_version(REPO, args.repeats, "floor"),
        "provenance": provenance(),
    }
    publish(res, table(res), "step_versions.json", "step_versions")


if __name__ == "__main__":
    main()
