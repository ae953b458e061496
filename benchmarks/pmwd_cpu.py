"""distpm and pmwd side by side on this machine's CPU: the standard problem of the GPU check
(``gpu/steps.py problem`` and ``gpu/pmwd_problem.py``: N^3 particles on an N^3 mesh in
256 Mpc/h, 2LPT at a = 0.1, 10 steps to a = 1, float32, one device), forward and gradient.

Each measurement is a process of its own (its own peak memory), the two codes alternating
within each round; a process times ``--repeats`` calls after its first (compile) call and
reports their median. The table gives the median over the rounds, pmwd's time over
distpm's, and each process's peak resident memory. pmwd is not on a package registry: pass
a folder holding its package and mcfit's (see ``pmwd_cpu.md``).

    python benchmarks/pmwd_cpu.py --pmwd-src /tmp/pmwd-src [--n 128] [--rounds 3]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from timing import measured_on, provenance, publish, rss_mib

HERE = Path(__file__).resolve().parent
MODES = ("forward", "gradient")


def _distpm(n, mode, repeats):
    """In a child process: distpm's problem, with this process's peak memory."""
    sys.path.insert(0, str(HERE / "gpu"))
    import steps

    out = steps.problem(n, mode=mode, repeats=repeats)
    return {**out, "peak_rss_mib": rss_mib()}


def _measure(code, n, mode, repeats, pmwd_src):
    if code == "distpm":
        cmd = [sys.executable, __file__, "--child", json.dumps([n, mode, repeats])]
        env = os.environ
    else:
        cmd = [sys.executable, str(HERE / "gpu" / "pmwd_problem.py"), "--n", str(n),
               "--mode", mode, "--repeats", str(repeats)]  # fmt: skip
        env = dict(os.environ, PYTHONPATH=str(pmwd_src))
    print("running:", code, n, mode, file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise RuntimeError(f"{code} {mode} failed:\n{done.stderr[-3000:]}")
    line = next(x for x in reversed(done.stdout.splitlines()) if x.startswith("{"))
    out = json.loads(line)
    return {k: out[k] for k in ("median_s", "compile_s", "peak_rss_mib")}


def table(results) -> str:
    rows = [
        "| N | mode | distpm | pmwd | pmwd / distpm (time) | distpm peak memory | pmwd peak "
        "memory | distpm / pmwd (memory) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results["rows"]:
        d, p = r["distpm"], r["pmwd"]
        rows.append(
            f"| {r['n']} | {r['mode']} | {d['median_s']:.2f} s | {p['median_s']:.2f} s | "
            f"{p['median_s'] / d['median_s']:.2f}x | {d['peak_rss_mib']:.0f} MiB | "
            f"{p['peak_rss_mib']:.0f} MiB | {d['peak_rss_mib'] / p['peak_rss_mib']:.2f} |"
        )
    setting = (
        f"one CPU device; medians over {results['rounds']} alternating rounds, each the "
        f"median of {results['repeats']} calls after the first"
    )
    return "\n".join(rows) + "\n\n" + measured_on(results, setting)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pmwd-src", type=Path, help="folder holding pmwd/ and mcfit/")
    ap.add_argument("--n", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_distpm(*json.loads(args.child))), flush=True)
        return
    if args.pmwd_src is None or not (args.pmwd_src / "pmwd").is_dir():
        ap.error("--pmwd-src must name a folder holding pmwd/ and mcfit/ (see pmwd_cpu.md)")
    runs = {(mode, code): [] for mode in MODES for code in ("distpm", "pmwd")}
    for _ in range(args.rounds):
        for mode in MODES:
            for code in ("distpm", "pmwd"):
                runs[mode, code].append(_measure(code, args.n, mode, args.repeats, args.pmwd_src))
    rows = []
    for mode in MODES:
        row = {"n": args.n, "mode": mode}
        for code in ("distpm", "pmwd"):
            each = runs[mode, code]
            row[code] = {
                "median_s": statistics.median(r["median_s"] for r in each),
                "peak_rss_mib": max(r["peak_rss_mib"] for r in each),
                "rounds": each,
            }
        rows.append(row)
    results = {"rows": rows, "rounds": args.rounds, "repeats": args.repeats, **provenance()}
    publish(results, table(results), "pmwd_cpu.json", "pmwd_cpu")


if __name__ == "__main__":
    main()
