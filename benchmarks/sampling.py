"""Samplers of the field-level posterior side by side: gradients per effective sample.

The posterior of ``examples/field_level_inference.py`` (32^3 white noise and Omega_m,
sigma8; its data, start and change of variables), sampled by each of NUTS, MCLMC and MAMS
(``examples/samplers.py``) in the same number of chains from the same starts (chain c's key
is ``fold_in(key, c)``; each chain climbs 100 Adam steps first, not counted). For each: the
gradients of log p the sampling took per effective sample of Omega_m, sigma8 and the white
noise's power in the three lowest k bins (one estimator for all: BlackJAX's
``effective_sample_size`` over the chains), the warm-up's gradients, R-hat, posterior means
and widths, and the wall time. Writes ``results/sampling.json`` and the table in
``sampling.md`` after each sampler.

    python benchmarks/sampling.py --chains 4   # ~95 min on 2 cores
"""

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path

from timing import measured_on, provenance, publish

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
RESULTS = Path(__file__).resolve().parent / "results" / "sampling.json"
BINS = ("P(k1)", "P(k2)", "P(k3)")


def _arguments():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samplers", default="nuts,mclmc,mams", help="comma-separated")
    ap.add_argument("--chains", type=int, default=4)
    ap.add_argument("--warmup", type=int, default=None, help="default: the example's")
    ap.add_argument("--samples", type=int, default=None, help="default: the example's")
    return ap.parse_args()


def run_one(example, sampler: str, args) -> dict:
    """The example's chains with ``sampler``; its summary.json's numbers."""
    warmup, samples = example.LENGTHS[sampler]
    run = dataclasses.replace(
        example.FULL,
        sampler=sampler,
        chains=args.chains,
        warmup=args.warmup or warmup,
        samples=args.samples or samples,
    )
    with tempfile.TemporaryDirectory() as out:
        example.main(run, Path(out))
        summary = json.loads((Path(out) / "summary.json").read_text())
    keep = (
        "posterior_mean", "posterior_sd", "rhat", "ess", "ess_low_power", "gradients",
        "warmup_gradients", "gradients_per_sample", "gradients_per_ess", "acceptance",
        "tuned", "seconds", "truth_in_95",
    )  # fmt: skip
    return {"sampler": sampler, "chains": run.chains, "warmup": run.warmup,
            "samples": run.samples, **{k: summary[k] for k in keep}}  # fmt: skip


def table(rows, p) -> str:
    names = ("Omega_m", "sigma8", *BINS)
    head = " | ".join(f"grads/ESS {n}" for n in names)
    lines = [
        f"| sampler | chains x samples | {head} | warm-up grads (all chains) | R-hat (Om, s8) | "
        "Omega_m | sigma8 | time |",
        "|---|---|" + "---|" * len(names) + "---|---|---|---|---|",
    ]
    for r in rows:
        per_ess = " | ".join(f"{g:.0f}" for g in r["gradients_per_ess"])
        rhat = "n/a" if r["rhat"] is None else ", ".join(f"{x:.3f}" for x in r["rhat"])
        moments = zip(r["posterior_mean"], r["posterior_sd"], strict=True)
        stats = [f"{m:.3f} +- {s:.3f}" for m, s in moments]
        lines.append(
            f"| {r['sampler']} | {r['chains']} x {r['samples']} | {per_ess} | "
            f"{r['warmup_gradients']:.0f} | {rhat} | {stats[0]} | {stats[1]} | "
            f"{r['seconds'] / 60:.0f} min ({r['date'][:10]}) |"
        )
    lines.append("")
    lines.append(measured_on(p, "one CPU device; each row on the date it gives"))
    return "\n".join(lines)


def main():
    args = _arguments()
    sys.path.insert(0, str(EXAMPLES))
    import field_level_inference as example

    # the rows of samplers not run now stay, each with the date and version it ran at
    rows = json.loads(RESULTS.read_text())["rows"] if RESULTS.exists() else []
    for sampler in args.samplers.split(","):
        p = provenance()
        row = {**run_one(example, sampler, args), "date": p["date"]}
        row["distpm"] = p["distpm"]
        rows = [r for r in rows if r["sampler"] != sampler] + [row]
        rows.sort(key=lambda r: example.samplers.SAMPLERS.index(r["sampler"]))
        publish({"rows": rows, **p}, table(rows, p), RESULTS.name, "sampling")


if __name__ == "__main__":
    main()
