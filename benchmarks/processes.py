"""One sharded PM step on a 2x2 device grid: 2 processes x 2 devices against 1 process x 4.

The parent starts the measurement twice, each time in fresh processes of
this script (``--worker``): as 2 processes with 2 emulated CPU devices each,
joined through distpm's runtime (``jax.distributed`` with gloo CPU
collectives, environment from ``distpm.cli.launch.worker_environment``), and
as 1 process with 4 emulated CPU devices (no runtime). With 2 processes the
mesh axis x crosses the processes and y stays inside each.

A worker does for each N (mesh = particles = N^3, box 4N Mpc/h, as
``scaling.py``): it compiles the kick-drift-kick step ``distpm.simulation.step``
once and times it (``timing.time_calls``: warm-up, then the median of
``--repeats`` calls each ended with ``jax.block_until_ready``). It then reads
every collective of the compiled step's HLO (kind, mesh axis, result arrays)
and compiles a *replay*: one ``jax.shard_map`` function over the same mesh
that runs exactly these collectives, in the same order (chained with
``optimization_barrier``), on zero buffers of the same shapes and dtypes -
all-to-alls as tiled ``all_to_all`` along the op's axis, collective-permutes
as ``ppermute`` shifted by one along it, all-reduces as ``psum``. The replay
is timed the same way. Its time is that of the step's collectives without the
computation between them, so it ignores any overlap of the two; share = replay
time / step time.

Process 0 prints its results as JSON; the parent writes
``results/processes.json`` and the table between the processes markers of
``processes.md``. A launch that has not finished after ``--timeout`` seconds is
stopped (its processes killed) and reported as such.

    python benchmarks/processes.py                          # N = 64, 128
    python benchmarks/processes.py --sizes 32 --repeats 1   # quick check
"""

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import tempfile
import time

import hlo
import jax  # importing jax does not start its backends: the runtime can still come first
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from timing import measured_on, provenance, publish, time_calls

from distpm.cli.launch import free_port, worker_environment
from distpm.parallel import runtime
from distpm.parallel.devices import device_mesh

GRID = (2, 2)
RESULT = "RESULT "  # prefix of the JSON line a worker prints on stdout
REPLAY_NOTE = (
    "collectives alone = the step's collectives (from its compiled HLO) replayed with the same "
    "sizes, dtypes, mesh axes and order, without the computation between them; it ignores any "
    "overlap of communication and computation"
)
LAYOUTS = {  # name: (processes, devices per process)
    "1 process x 4 devices": (1, 4),
    "2 processes x 2 devices (gloo)": (2, 2),
}

# ---- worker -----------------------------------------------------------------------


def start_runtime() -> None:
    """Join the other processes when launched as one of several (before any jax use)."""
    if os.environ.get("DISTPM_NUM_PROCESSES"):
        runtime.initialize(runtime.settings_from_env())


def import_scaling():
    """``scaling.py``'s helpers, without its 8 devices (it sets XLA_FLAGS at import)."""
    flags = os.environ.get("XLA_FLAGS")
    import scaling

    if flags is None:
        os.environ.pop("XLA_FLAGS")
    else:
        os.environ["XLA_FLAGS"] = flags
    return scaling


def collectives(text: str, grid) -> list[dict]:
    """``hlo.collective_ops`` with the arrays of each op's result: [[dtype, dims], ...]."""
    ops = hlo.collective_ops(text, grid)
    instructions = [m for m in map(hlo.INSTRUCTION.match, text.splitlines()) if m]
    done_shape = {
        m["args"].split()[-1].lstrip("%"): m["shape"]
        for m in instructions
        if m["op"].endswith("-done")
    }
    shapes = [
        done_shape[m["name"]] if m["op"].endswith("-start") else m["shape"]
        for m in instructions
        if m["op"].removesuffix("-start") in hlo.KINDS
    ]
    for op, shape in zip(ops, shapes, strict=True):
        op["arrays"] = [
            [dtype, [int(d) for d in dims.split(",") if d]]
            for dtype, dims in hlo.ARRAY.findall(shape)
        ]
    return ops


def replay(ops, mesh):
    """(jitted shard_map running ``ops`` in order on per-device buffers, the zero buffers)."""
    dtypes = {"f32": np.float32, "f64": np.float64, "s32": np.int32, "s64": np.int64,
              "u32": np.uint32, "c64": np.complex64, "c128": np.complex128}  # fmt: skip
    names = {"x": "x", "y": "y", "xy": ("x", "y")}
    spec = P(("x", "y"))  # one block per device
    sharding = NamedSharding(mesh, spec)
    n_dev = mesh.devices.size

    def zeros(shape, dtype):  # a global array whose block on every device is ``shape``
        full = (n_dev * shape[0], *shape[1:])
        return jax.jit(lambda: jnp.zeros(full, dtype), out_shardings=sharding)()

    buffers = []
    for op in ops:
        kinds = {dtype for dtype, _ in op["arrays"]}
        if op["kind"] not in ("all-to-all", "collective-permute", "all-reduce") or len(kinds) > 1:
            raise NotImplementedError(f"no replay for {op['kind']} of {op['arrays']}")
        dtype = dtypes[kinds.pop()]
        if op["kind"] == "all-to-all":  # all chunks (tuple form) or one array: one flat buffer
            buffers.append(zeros((sum(math.prod(dims) for _, dims in op["arrays"]),), dtype))
        else:
            buffers.append(tuple(zeros(tuple(dims), dtype) for _, dims in op["arrays"]))

    def collective(op, x):
        axis = names[op["axis"]]
        if op["kind"] == "all-to-all":
            return jax.lax.all_to_all(x, axis, 0, 0, tiled=True)
        if op["kind"] == "collective-permute":
            p = jax.lax.axis_size(axis)
            return jax.lax.ppermute(x, axis, [(i, (i + 1) % p) for i in range(p)])
        return jax.lax.psum(x, axis)

    def local(*bufs):
        outs, previous = [], ()
        for op, buf in zip(ops, bufs, strict=True):
            previous, buf = jax.lax.optimization_barrier((previous, buf))  # keep the step's order
            previous = collective(op, buf)
            outs.append(previous)
        return tuple(outs)

    specs = tuple(jax.tree.map(lambda _: spec, b) for b in buffers)
    fn = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=specs, out_specs=specs))
    return fn, buffers


def measure(scaling, n: int, repeats: int) -> dict:
    """Step time and replayed-collectives time for N on the 2x2 grid."""
    _, compiled, compile_s, step, _, _ = scaling.timed_step(n, GRID, repeats)
    ops = collectives(compiled.as_text(), GRID)

    fn, buffers = replay(ops, device_mesh(GRID))
    replayed = fn.lower(*buffers).compile()
    _, comm = time_calls(replayed, *buffers, repeats=repeats)
    key = lambda o: (o["kind"], o["axis"], o["bytes"])  # noqa: E731
    replay_ops = hlo.collective_ops(replayed.as_text(), GRID)
    return {
        "n": n,
        "grid": list(GRID),
        "compile_s": compile_s,
        "median_s": step["median_s"],
        "all_s": step["all_s"],
        "collectives_s": comm["median_s"],
        "collectives_all_s": comm["all_s"],
        "share": comm["median_s"] / step["median_s"],
        "collectives": hlo.summarise(ops),
        "replay_matches_step": sorted(map(key, replay_ops)) == sorted(map(key, ops)),
        "ops": ops,
    }


def worker(sizes, repeats) -> None:
    """Measure every N; process 0 prints the results as one JSON line."""
    start_runtime()
    scaling = import_scaling()
    rank = jax.process_index()
    runs = []
    for n in sizes:
        print(f"[{rank}] N={n}", file=sys.stderr, flush=True)
        runs.append(measure(scaling, n, repeats))
        r = runs[-1]
        times = f"step {r['median_s']:.3f} s, collectives alone {r['collectives_s']:.3f} s"
        print(f"[{rank}]   {times}", file=sys.stderr, flush=True)
    if rank == 0:
        info = {
            "processes": jax.process_count(),
            "devices": jax.device_count(),
            "local_devices": jax.local_device_count(),
            "xla_flags": os.environ.get("XLA_FLAGS", ""),
            "jax": jax.__version__,
            "runs": runs,
        }
        print(RESULT + json.dumps(info), flush=True)


# ---- parent -----------------------------------------------------------------------


def environments(processes: int, devices: int) -> list[dict]:
    """The environment of every process of a layout."""
    if processes > 1:
        port = free_port()
        return [worker_environment(rank, processes, port, devices) for rank in range(processes)]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DISTPM_")}
    flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
    flags.append(f"--xla_force_host_platform_device_count={devices}")
    env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu", PYTHONUNBUFFERED="1")
    return [env]


def stop(procs) -> None:
    """Terminate the processes still running; kill those alive 10 s later."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(layout: str, args) -> dict:
    """Run the workers of one layout; return process 0's results (or why there are none)."""
    processes, devices = LAYOUTS[layout]
    command = [sys.executable, __file__, "--worker", "--repeats", str(args.repeats), "--sizes"]
    command += [str(n) for n in args.sizes]
    t = time.perf_counter()
    with tempfile.TemporaryFile("w+") as out:
        procs = [
            subprocess.Popen(command, env=env, stdout=out if rank == 0 else subprocess.DEVNULL)
            for rank, env in enumerate(environments(processes, devices))
        ]
        deadline = time.monotonic() + args.timeout
        problem = None
        try:
            while any(p.poll() is None for p in procs):
                failed = [p.returncode for p in procs if p.poll() not in (None, 0)]
                if failed:
                    problem = f"a worker exited with status {failed[0]}"
                    break
                if time.monotonic() > deadline:
                    problem = f"timed out after {args.timeout:.0f} s; workers killed"
                    break
                time.sleep(0.5)
        finally:
            stop(procs)
        if problem is None and any(p.returncode for p in procs):
            problem = f"worker exit statuses {[p.returncode for p in procs]}"
        out.seek(0)
        lines = [line for line in out if line.startswith(RESULT)]
    result = {"layout": layout, "processes": processes, "devices_per_process": devices}
    result["wall_s"] = time.perf_counter() - t
    if lines and problem is None:
        return {**result, **json.loads(lines[-1].removeprefix(RESULT))}
    return {**result, "error": problem or "no result printed", "runs": []}


def markdown(results) -> str:
    rows = [
        "| N | layout | step (median) | collectives alone | share |",
        "|---|---|---|---|---|",
    ]
    for n in results["config"]["sizes"]:
        for launched in results["layouts"]:
            for r in (r for r in launched["runs"] if r["n"] == n):
                rows.append(
                    f"| {n} | {launched['layout']} | {r['median_s']:.3f} s | "
                    f"{r['collectives_s']:.3f} s | {r['share']:.0%} |"
                )
    failed = [f"- {x['layout']}: {x['error']}" for x in results["layouts"] if "error" in x]
    runs = [r for x in results["layouts"] for r in x["runs"]]
    matches = bool(runs) and all(r["replay_matches_step"] for r in runs)
    return "\n".join(
        [
            *rows,
            *([""] + failed if failed else []),
            "",
            f"Grid 2x2, box 4N Mpc/h; {REPLAY_NOTE}; share = collectives alone / step. "
            + (
                "The replays' compiled HLO holds the same collectives as the step's."
                if matches
                else "**The replay's compiled HLO does not hold the same collectives as the "
                "step's** (see `results/processes.json`)."
            ),
            "",
            measured_on(results, f"median of {results['config']['repeats']} calls"),
        ]
    )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[64, 128], help="N: N^3 mesh")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per launch")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.sizes, args.repeats)
        return
    results = {
        **provenance(),
        "python": platform.python_version(),
        "config": {
            "sizes": args.sizes,
            "grid": list(GRID),
            "repeats": args.repeats,
            "box_size": "4 N Mpc/h",
        },
        "note": REPLAY_NOTE,
        "layouts": [],
    }
    for layout in LAYOUTS:
        print(layout, file=sys.stderr, flush=True)
        launched = launch(layout, args)
        if "error" in launched:
            print(f"  {launched['error']}", file=sys.stderr, flush=True)
        results["layouts"].append(launched)
    publish(results, markdown(results), "processes.json", "processes")


if __name__ == "__main__":
    main()
