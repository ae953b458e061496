"""Side-by-side benchmark of distpm and JaxPM on the standard problem.

Every measurement runs in its own process (so each has its own peak memory),
alternating between the two codes. Results go to ``results/standard.json``
and to the table between the markers in ``benchmarks/README.md``.

    python benchmarks/run.py --jaxpm-python /path/to/jaxpm-venv/bin/python

JaxPM must be installed in a separate virtual environment (see README.md);
without ``--jaxpm-python`` only distpm is measured.
"""

import argparse
import datetime
import json
import platform
import subprocess
import sys
from pathlib import Path

from timing import publish

HERE = Path(__file__).resolve().parent


def measure(python, script, *args):
    cmd = [python, str(HERE / script), *map(str, args)]
    print("running:", " ".join(cmd[1:]), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def _pair_rows(r):
    d, j = r["distpm"], r.get("jaxpm")
    label = r["mode"]
    if j and r["mode"] == "gradient":
        label += f" (JaxPM max_steps={j['max_steps']})"
    time_j = f"{j['median_s']:.2f} s" if j else "-"
    time_ratio = f"{j['median_s'] / d['median_s']:.2f}x" if j else "-"
    mem_j = f"{j['peak_rss_mib']:.0f} MiB" if j else "-"
    mem_ratio = f"{d['peak_rss_mib'] / j['peak_rss_mib']:.0%} of JaxPM" if j else "-"
    head = f"| {r['n']} | {r['steps']} | {label}"
    return [
        f"{head} time | {d['median_s']:.2f} s | {time_j} | {time_ratio} |",
        f"{head} peak memory | {d['peak_rss_mib']:.0f} MiB | {mem_j} | {mem_ratio} |",
    ]


def table(results):
    rows = [
        "| N | steps | quantity | distpm | JaxPM | JaxPM / distpm |",
        "|---|---|---|---|---|---|",
    ]
    for r in results["pairs"]:
        rows += _pair_rows(r)
    for s in results["step_split"]:
        ms = "/".join(f"{1e3 * s[key]:.0f}" for key in ("paint_s", "ffts_s", "readout_s"))
        ratio = s["mass_assignment_over_ffts"]
        rows.append(
            f"| {s['mesh']} | 1 force | paint / FFTs / readout | {ms} ms | - | "
            f"(paint+readout)/FFTs = {ratio:.2f} |"
        )
    for g in results["gradient_memory"]:
        rows.append(
            f"| {g['mesh']} | {g['steps']} | distpm gradient peak memory | "
            f"{g['peak_rss_mib']:.0f} MiB ({g['median_s']:.2f} s) | - | - |"
        )
    return "\n".join(rows)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jaxpm-python", help="python of the JaxPM virtual environment")
    ap.add_argument("--n", type=int, nargs="+", default=[64, 128])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument(
        "--jaxpm-max-steps",
        type=int,
        nargs="+",
        default=[4096],
        help="diffrax max_steps values for JaxPM's gradient (4096: its default)",
    )
    args = ap.parse_args()
    results = {
        "date": datetime.date.today().isoformat(),
        "machine": platform.platform(),
        "python": platform.python_version(),
        "pairs": [],
        "step_split": [],
        "gradient_memory": [],
    }
    for n in args.n:
        for mode in ("forward", "gradient"):
            variants = args.jaxpm_max_steps if mode == "gradient" else [4096]
            for max_steps in variants:
                pair = {"n": n, "steps": 10, "mode": mode}
                pair["distpm"] = measure(
                    sys.executable,
                    "distpm_problem.py",
                    "--n",
                    n,
                    "--mode",
                    mode,
                    "--repeats",
                    args.repeats,
                )[0]
                if args.jaxpm_python:
                    pair["jaxpm"] = measure(
                        args.jaxpm_python,
                        "jaxpm_problem.py",
                        "--n",
                        n,
                        "--mode",
                        mode,
                        "--repeats",
                        args.repeats,
                        "--max-steps",
                        max_steps,
                    )[0]
                results["pairs"].append(pair)
        for steps in (10, 40):
            results["gradient_memory"].append(
                measure(
                    sys.executable,
                    "distpm_problem.py",
                    "--n",
                    n,
                    "--mode",
                    "gradient",
                    "--steps",
                    steps,
                    "--repeats",
                    1,
                )[0]
            )
    results["step_split"] = measure(sys.executable, "step_split.py", "--n", *args.n)
    publish(results, table(results), "standard.json", "results")


if __name__ == "__main__":
    main()
