"""The timing protocol shared by every benchmark script (standard library only,
so that it runs in distpm's environment and in JaxPM's).

A first call (compilation + first run, reported as ``compile_s``), then
``repeats`` calls each ended with ``jax.block_until_ready``; ``median_s`` is
their median. Peak memory is the process's maximum resident set size.
"""

import argparse
import resource
import statistics
import time


def rss_mib():
    """Peak resident set size of this process so far [MiB] (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def time_calls(fn, *args, repeats):
    """Time ``fn(*args)``; return (first output, dict of timings and memory)."""
    import jax

    t = time.perf_counter()
    out = jax.block_until_ready(fn(*args))
    compile_s = time.perf_counter() - t
    rss_compile = rss_mib()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - t)
    return out, {
        "compile_s": compile_s,
        "median_s": statistics.median(times) if times else None,
        "all_s": times,
        "peak_rss_compile_mib": rss_compile,
        "peak_rss_mib": rss_mib(),
    }


def problem_arguments(description):
    """The command-line options every standard-problem runner takes."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--n", type=int, required=True, help="particles = mesh = N^3")
    ap.add_argument("--mode", choices=["forward", "gradient"], required=True)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    return ap
