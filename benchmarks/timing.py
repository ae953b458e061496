"""The timing protocol and the outputs shared by every benchmark script
(standard library only, so that it runs in distpm's environment and in JaxPM's).

A first call (compilation + first run, reported as ``compile_s``), then
``repeats`` calls each ended with ``jax.block_until_ready``; ``median_s`` is
their median. Peak memory is the process's maximum resident set size.
"""

import argparse
import json
import resource
import statistics
import subprocess
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def rss_mib():
    """Peak resident set size of this process so far [MiB] (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def median_time(fn, repeats):
    """(median seconds over ``repeats`` calls of ``fn()`` after one warm-up call, the last
    result); ``fn`` must wait for its own result (``block_until_ready``)."""
    out = fn()
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), out


def median_times(fns, repeats):
    """(medians, last results) of each of ``fns`` over ``repeats`` rounds in which each is
    called once, in turn, after one warm-up call of each: side by side, so that a machine
    whose speed drifts (this one, by up to 30% within minutes) weighs on all of them alike.
    Each ``fn`` must wait for its own result."""
    outs = [fn() for fn in fns]
    times = [[] for _ in fns]
    for _ in range(repeats):
        for i, fn in enumerate(fns):
            t = time.perf_counter()
            outs[i] = fn()
            times[i].append(time.perf_counter() - t)
    return [statistics.median(t) for t in times], outs


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


def git_version() -> str:
    """``git describe`` of the checkout the benchmark runs from."""
    done = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=HERE, capture_output=True, text=True
    )
    return done.stdout.strip()


def provenance() -> dict:
    """Where and when a benchmark ran: machine, CPU count, jax and distpm versions, date
    (UTC, to the minute)."""
    import datetime
    import os
    import platform

    import jax

    return {
        "machine": platform.platform(),
        "cpus": os.cpu_count(),
        "jax": jax.__version__,
        "distpm": git_version(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }


def measured_on(p: dict, setting: str = "") -> str:
    """The closing line of every benchmark's table, from ``provenance()``; ``setting`` says
    how it ran where that matters (e.g. "one CPU device", "median of 5 calls")."""
    setting = f", {setting}" if setting else ""
    return (
        f"Measured on {p['date']} on {p['machine']} ({p['cpus']} cores){setting}, "
        f"jax {p['jax']}, distpm {p['distpm']}."
    )


def publish(results: dict, text: str, json_name: str, marker: str) -> None:
    """Write ``results`` to results/<json_name>, put ``text`` between the
    ``<!-- marker:begin -->`` and ``<!-- marker:end -->`` lines of the benchmark's page (the
    Markdown file in benchmarks/ that holds them), print it."""
    out = HERE / "results" / json_name
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(results, indent=1))
    begin, end = f"<!-- {marker}:begin -->", f"<!-- {marker}:end -->"
    page = next(p for p in sorted(HERE.glob("**/*.md")) if begin in p.read_text())
    head, rest = page.read_text().split(begin)
    page.write_text(head + begin + "\n" + text + "\n" + end + rest.split(end, 1)[1])
    print(text)
