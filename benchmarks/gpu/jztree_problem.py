"""kNN or friends-of-friends on a given point set with jz-tree (PyPI jztree 1.1.0 + its CUDA
backend jztree-cu13), one measurement per process, for comparison with distpm's answers on
the same points. jz-tree runs on CUDA GPUs only.

Input: ``--points FILE.npy``, (N, 3) positions [Mpc/h] in a periodic box [0, L)^3 of side
``--box L`` (cast to float32; wrapped into the box if they stray).
  knn: jztree.knn.knn(pos, k=K+1, boxsize=L), periodic, exact; the point itself is its own
       nearest neighbour at distance 0 (column 0) in jz-tree's self-query, so K+1 are asked
       for and column K is the K-th nearest *other* point: mean_kth_distance [Mpc/h] is the
       mean of that column over all points (float64 sum on the host). The timed function
       returns jz-tree's full answer (distances and indices, input order).
  fof: jztree.fof.fof_labels(pos, rlink=B, boxsize=L), periodic, B the absolute linking
       length [Mpc/h]; labels point at each group's first member in z-order. n_groups
       counts groups with >= 2 members; n_groups_min20 those with >= 20 (distpm.fof's default
       min_members); largest_group is the size of the largest.

Protocol (as benchmarks/timing.py): points go to the device first (untimed); the first call
is compile_s (compilation + first run); then ``--repeats`` calls, each ended with
jax.block_until_ready: times_s, median_s their median. Outputs are copied to the host outside
the timed region (for ``finite``, ``bitwise_repeats`` and the checksums). peak_gpu_bytes /
bytes_limit come from device.memory_stats(). One JSON line on stdout; everything else goes to
stderr. Without a CUDA device (or without an importable jztree) it prints
{"code": "jztree", "skipped": "<reason>"} and exits with status 3.

    PYTHONPATH=<dir with jztree/ and jztree_cuda/> python benchmarks/gpu/jztree_problem.py \
        --points pos.npy --box 256 --what knn --k 8
"""

import argparse
import importlib.metadata
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from timing import rss_mib  # noqa: E402


def skip(reason):
    print(json.dumps({"code": "jztree", "skipped": reason}))
    sys.exit(3)


def version():
    """jztree's installed version, else its _version.py's (1.0.4.dev18 in the 1.1.0 wheel)."""
    try:
        return importlib.metadata.version("jztree")
    except importlib.metadata.PackageNotFoundError:
        pass
    try:
        from jztree import _version

        return f"{_version.__version__} (_version.py)"
    except ImportError:
        return None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--points", required=True, help=".npy file of (N, 3) positions [Mpc/h]")
    ap.add_argument("--box", type=float, required=True, help="periodic box side [Mpc/h]")
    ap.add_argument("--what", choices=["knn", "fof"], required=True)
    ap.add_argument("--k", type=int, default=8, help="neighbours, the point itself excluded")
    ap.add_argument("--linking-length", type=float, default=None, help="absolute [Mpc/h]")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.what == "fof" and args.linking_length is None:
        ap.error("--what fof needs --linking-length")

    import jax
    import numpy as np

    try:
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
    except Exception as e:
        gpus, why = [], f"{type(e).__name__}: {e}"
    else:
        why = f"jax's devices are {[str(d) for d in jax.devices()]}"
    if not gpus:
        skip(f"jz-tree needs a CUDA device; {why}")
    try:
        import jztree as jz
    except Exception as e:
        skip(f"jztree import failed: {type(e).__name__}: {e}")

    box = float(args.box)
    pos = np.asarray(np.load(args.points), dtype=np.float32)
    if pos.ndim != 2 or pos.shape[1] != 3:
        sys.exit(f"jztree_problem.py: points of shape {pos.shape}, not (N, 3)")
    pos = np.mod(pos, np.float32(box))
    pos[pos >= box] = 0.0  # float32 mod of a tiny negative value can round up to box
    pos = jax.block_until_ready(jax.device_put(pos, gpus[0]))

    if args.what == "knn":
        fn = jax.jit(lambda p: jz.knn.knn(p, k=args.k + 1, boxsize=box))
    else:
        fn = jax.jit(lambda p: jz.fof.fof_labels(p, rlink=args.linking_length, boxsize=box)[1])

    def host(out):
        return [np.asarray(x) for x in jax.tree.leaves(out)]

    t = time.perf_counter()
    out = host(jax.block_until_ready(fn(pos)))
    compile_s = time.perf_counter() - t
    finite = all(bool(np.isfinite(x).all()) for x in out)
    times, first, bitwise = [], None, True
    for _ in range(args.repeats):
        t = time.perf_counter()
        dev = jax.block_until_ready(fn(pos))
        times.append(time.perf_counter() - t)
        out = host(dev)
        del dev
        finite = finite and all(bool(np.isfinite(x).all()) for x in out)
        if first is None:
            first = out
        else:
            bitwise = bitwise and all(
                np.array_equal(a.view(np.uint32), b.view(np.uint32))
                for a, b in zip(first, out, strict=True)
            )

    n = len(pos)
    result = {"code": "jztree", "what": args.what, "n_points": n, "box": box}
    if args.what == "knn":
        rnn, inn = out
        result["k"] = args.k
        result["mean_kth_distance"] = float(rnn[:, args.k].astype(np.float64).mean())
        result["self_at_zero_fraction"] = float(np.mean(rnn[:, 0] == 0))
        result["self_first_fraction"] = float(np.mean(inn[:, 0] == np.arange(n)))
    else:
        counts = np.bincount(out[0], minlength=n)
        result["linking_length"] = args.linking_length
        result["n_groups"] = int(np.sum(counts >= 2))
        result["n_groups_min20"] = int(np.sum(counts >= 20))
        result["largest_group"] = int(counts.max())

    stats = gpus[0].memory_stats()
    result.update(
        compile_s=compile_s,
        median_s=statistics.median(times) if times else None,
        times_s=times,
        bitwise_repeats=bitwise if len(times) > 1 else None,
        finite=finite,
        peak_gpu_bytes=stats.get("peak_bytes_in_use") if stats else None,
        bytes_limit=stats.get("bytes_limit") if stats else None,
        peak_rss_mib=rss_mib(),
        device=str(gpus[0]),
        jax_version=jax.__version__,
        jztree_version=version(),
    )
    print(json.dumps(result))


if __name__ == "__main__":
    main()
