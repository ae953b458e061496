"""Simulation-based calibration of the field-level posterior (Talts et al. 2018).

Truths drawn from the prior: Omega_m and sigma8 uniform in the example's ``PRIOR``, the
white noise from its own seed, the data's noise from another. Each truth's mock data are
inferred by one chain of ``--sampler`` at the example's smoke size (16^3 in 64 Mpc/h, the
same cells as the 32^3 example), and the truth ranked among its chain's samples, thinned
to about one per effective sample. If the posterior and the sampler are right, the ranks
are uniform: the Kolmogorov-Smirnov p-value of each parameter's rank fractions against
U(0, 1) is what this reports (and a figure of their empirical CDFs with the 95% band of
uniform ones). Writes ``results/calibration.json``, ``results/calibration.png`` and the
table in ``calibration.md``.

    python benchmarks/calibration.py --truths 20 --sampler mclmc   # ~25 min on 2 cores
"""

import argparse
import dataclasses
import sys

import numpy as np
from timing import HERE, measured_on, provenance, publish

EXAMPLES = HERE.parent / "examples"
LENGTHS = (200, 800)  # warm-up and samples of each chain


def _arguments():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--truths", type=int, default=20)
    ap.add_argument("--sampler", default="mclmc")
    ap.add_argument("--samples", type=int, default=LENGTHS[1])
    return ap.parse_args()


def rank_fractions(example, run, truths) -> list[dict]:
    """Per truth: its rank fraction among its chain's thinned samples, per parameter."""
    import blackjax
    import jax

    rows = []
    for i, theta in enumerate(truths):
        _, data = example.mock_data(run.cfg, theta, seed=1000 + i, noise_seed=2000 + i)
        key = jax.random.fold_in(jax.random.key(3), i)
        chain = example.run_chain(key, run, data, i)[0]  # (samples, 2)
        ess = np.asarray(blackjax.diagnostics.effective_sample_size(chain[None]))
        row = {"truth": list(theta), "ess": ess.tolist(), "fraction": []}
        for p in range(2):  # thinned to about one sample per effective sample
            kept = chain[:: max(1, int(len(chain) / ess[p])), p]
            row["fraction"].append(float((np.sum(kept < theta[p]) + 0.5) / (len(kept) + 1)))
        rows.append(row)
        print(f"truth {i}: theta {np.round(theta, 4)}, rank fractions {row['fraction']}")
    return rows


def plot(fractions, p_values, names, out):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(fractions)
    u = np.linspace(0, 1, 201)
    band = 1.36 / np.sqrt(n)  # the KS test's 95% band around the uniform CDF
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.fill_between(u, u - band, u + band, color="0.85", label="95% band (uniform ranks)")
    for j, name in enumerate(names):
        x = np.sort(fractions[:, j])
        label = f"{name} (KS p = {p_values[j]:.2f})"
        ax.step(x, np.arange(1, n + 1) / n, where="post", label=label)
    ax.plot(u, u, "k:", lw=1)
    ax.set_xlabel("rank fraction of the truth")
    ax.set_ylabel("empirical CDF over the truths")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main():
    args = _arguments()
    sys.path.insert(0, str(EXAMPLES))
    import field_level_inference as example
    from scipy import stats

    warmup = LENGTHS[0]
    run = dataclasses.replace(
        example.SMOKE, sampler=args.sampler, chains=1, warmup=warmup, samples=args.samples
    )
    rng = np.random.default_rng(2026)
    prior = example.PRIOR
    truths = prior[:, 0] + (prior[:, 1] - prior[:, 0]) * rng.random((args.truths, 2))
    rows = rank_fractions(example, run, truths)
    fractions = np.array([r["fraction"] for r in rows])
    p_values = [float(stats.kstest(fractions[:, j], "uniform").pvalue) for j in range(2)]
    plot(fractions, p_values, example.NAMES, HERE / "results" / "calibration.png")

    p = provenance()
    lines = [
        f"{args.truths} truths from the prior, one {args.sampler} chain each ({warmup} warm-up, "
        f"{args.samples} samples), 16^3 in 64 Mpc/h.",
        "",
        "| parameter | KS p-value of the rank fractions | mean rank fraction | median ESS |",
        "|---|---|---|---|",
    ]
    for j, name in enumerate(example.NAMES):
        ess = np.median([r["ess"][j] for r in rows])
        lines.append(f"| {name} | {p_values[j]:.3f} | {fractions[:, j].mean():.3f} | {ess:.0f} |")
    lines += ["", "Plot: `results/calibration.png`.", "", measured_on(p)]
    results = {"rows": rows, "ks_p": p_values, "args": vars(args), "lengths": LENGTHS, **p}
    publish(results, "\n".join(lines), "calibration.json", "calibration")


if __name__ == "__main__":
    main()
