"""Field-level inference: Hamiltonian Monte Carlo over the initial white noise and
(Omega_m, sigma8) jointly, from a noisy final density.

The mock data are a simulation's final density contrast (32^3 particles in
128 Mpc/h, 5 steps of the 2LPT integrator, a = 0.1 -> 1) plus Gaussian noise of
``SIGMA`` per cell, made from a known truth (Planck 2018, white-noise seed 1).
The posterior, over 32^3 + 2 parameters, is

    log p = -|F_kmax (delta(w, Omega_m, sigma8) - data)|^2 / (2 SIGMA^2) - |w|^2 / 2
            + log prior(Omega_m, sigma8)

where F_kmax keeps the Fourier modes below ``K_MAX`` (the scale cut: above it the
data are not used) and the priors are uniform in ``PRIOR``. BlackJAX samples it
in two chains, each from its own random start: NUTS after Stan's window adaptation
of the step size and a diagonal mass matrix (the default), or MCLMC or MAMS after
their own tuning (``--sampler``; ``samplers.py`` beside this script).

Two changes of variables make the posterior easy for HMC:
- Omega_m and sigma8 are sampled as logits of their prior ranges (a Jacobian term);
- the noise is sampled as u with w = filter(u, g), g(k) = (1 + SNR^2(k))^-1/2 and
  SNR^2 = P_lin(k; Omega_m, sigma8) / (V_cell SIGMA^2) below K_MAX: each mode of u
  then has about unit posterior width, and the well-measured modes of the linear
  field stay put when the cosmology moves (a Jacobian term, log det = sum log g).

It writes ``chains.npz`` (the chains, the sampler's statistics, the noise's power in
the three lowest k bins per sample, the posterior-mean noise), ``corner.png``,
``traces.png``, ``correlation.png`` (r(k) of the posterior-mean noise and the truth)
and ``summary.json`` (R-hat, effective sample sizes and gradients per effective
sample, whether the truth lies in the 95% region, run time, peak memory).

    pip install -e ".[infer]"
    python examples/field_level_inference.py                # about 21 min on 2 CPU cores
    python examples/field_level_inference.py --smoke        # 16^3, a few sampler steps
    python examples/field_level_inference.py --devices 2x2  # the same chains on 4 devices
    python examples/field_level_inference.py --chains 4     # chain c's key: fold_in(key, c)
    python examples/field_level_inference.py --sampler mclmc  # or mams
"""

import argparse
import dataclasses
import functools
import json
import resource
import time
from pathlib import Path

import numpy as np

from distpm.parallel.decomposition import Decomposition
from distpm.parallel.devices import parse_devices, set_cpu_device_count


def _arguments():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="16^3, a few sampler steps")
    parser.add_argument("--devices", default=None, help="device grid PXxPY, e.g. 2x2 (CPU)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder for what it writes")
    parser.add_argument("--chains", type=int, default=None, help="chains (default 2)")
    parser.add_argument("--sampler", default="nuts", help="nuts (default), mclmc or mams")
    parser.add_argument("--warmup", type=int, default=None, help="warm-up steps per chain")
    parser.add_argument("--samples", type=int, default=None, help="samples per chain")
    return parser.parse_args()


if __name__ == "__main__":  # XLA reads the CPU device count when JAX starts: importing blackjax
    ARGS = _arguments()
    if ARGS.devices:
        set_cpu_device_count(np.prod(parse_devices(ARGS.devices)))

import blackjax  # noqa: E402
import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import matplotlib  # noqa: E402
import samplers  # noqa: E402

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from tqdm import tqdm  # noqa: E402

import distpm  # noqa: E402
from distpm.analysis.filter import filter_field, filter_log_determinant  # noqa: E402

TRUTH = distpm.Cosmology.planck18()
SIGMA = 1.0  # noise of the mock data per cell, in units of the density contrast
K_MAX = 0.25  # [h/Mpc] scale cut of the likelihood
PRIOR = np.array([[0.15, 0.5], [0.5, 1.1]])  # uniform ranges of Omega_m and sigma8
NAMES = ("Omega_m", "sigma8")


@dataclasses.dataclass(frozen=True)
class Run:
    """What one inference run does: the simulation, the sampler, the chains and their
    lengths (in sampler steps: a NUTS tree, an MCLMC integrator step, a MAMS proposal)."""

    cfg: distpm.SimConfig
    sampler: str = "nuts"
    chains: int = 2
    warmup: int = 150
    samples: int = 150
    max_doublings: int = 5  # NUTS trajectories of at most 2^5 - 1 = 31 gradient steps


# warm-up and samples per sampler at full size (benchmarks/sampling.md: MCLMC's chains did not
# agree after 200 warm-up steps at 32^3); MCLMC's and MAMS's steps take 2 gradients, NUTS's 31
LENGTHS = {"nuts": (150, 150), "mclmc": (1000, 800), "mams": (150, 300)}


FULL = Run(
    distpm.SimConfig(
        box_size=128.0,
        mesh_shape=32,
        n_steps=5,
        integrator="2lpt",
        a_start=0.1,
        a_stop=1.0,
        parallel=(1, 1),  # --devices sets the grid; no device query before that
    )
)
SMOKE = Run(
    # the same cell size; 16^3 on 4 devices moves a larger share between them
    FULL.cfg.replace(box_size=64.0, mesh_shape=16, particle_shape=16).on(exchange_factor=0.3),
    warmup=12,
    samples=4,
    max_doublings=3,
)


def cosmology(theta):
    """The cosmology at theta = (Omega_m, sigma8); the rest as the truth's."""
    return dataclasses.replace(TRUTH, Omega_c=theta[0] - TRUTH.Omega_b, sigma8=theta[1])


def final_density(w, theta, cfg):
    return distpm.density(distpm.simulate(w, cosmology(theta), cfg), cfg)


def below_cut(k):
    return (k < K_MAX).astype(k.dtype)


def preconditioner(theta, cfg):
    """g(k): about the posterior width of each noise mode, from the linear signal-to-noise."""
    v_cell = np.prod(cfg.cell_size)

    def g(k):
        snr2 = distpm.linear_power(k, cosmology(theta), cfg.a_stop) / (v_cell * SIGMA**2)
        return 1 / jnp.sqrt(1 + below_cut(k) * snr2)

    return g


def from_logits(logit):
    """(theta in PRIOR's ranges, log |d theta / d logit| less the constant log of the ranges).

    log s(1 - s) as log_sigmoid(x) + log_sigmoid(-x): in float32 1 - s is 0 from x = 17 on
    (and s from x = -104), where log(s * (1 - s)) is -inf and its gradient NaN; a chain whose
    step lands there stops for good (an MCLMC chain of the lensing example sat at the prior's
    bound, 0.15, for its 400 samples)."""
    theta = PRIOR[:, 0] + (PRIOR[:, 1] - PRIOR[:, 0]) * jax.nn.sigmoid(logit)
    return theta, jnp.sum(jax.nn.log_sigmoid(logit) + jax.nn.log_sigmoid(-logit))


def to_physical(params, cfg):
    """(w, theta, log Jacobian) from the sampled (u, logit theta)."""
    theta, log_jacobian = from_logits(params["logit"])
    g = preconditioner(theta, cfg)
    log_jacobian = log_jacobian + filter_log_determinant(cfg, g)
    return filter_field(params["u"], cfg, g), theta, log_jacobian


def log_density(params, data, cfg):
    w, theta, log_jacobian = to_physical(params, cfg)
    residual = filter_field(final_density(w, theta, cfg) - data, cfg, below_cut)
    return -0.5 * jnp.sum(residual**2) / SIGMA**2 - 0.5 * jnp.sum(w**2) + log_jacobian


def mock_data(cfg, theta=(TRUTH.Omega_m, TRUTH.sigma8), seed=1, noise_seed=7):
    """The true white noise (``seed``) and the noisy final density made from it at theta =
    (Omega_m, sigma8) (the data's noise from ``noise_seed``)."""
    truth = distpm.white_noise(seed, cfg)
    noise = SIGMA * jax.random.normal(jax.random.key(noise_seed), cfg.mesh_shape)
    return truth, final_density(truth, jnp.asarray(theta), cfg) + noise


def start(key, cfg):
    """A random start: u from its prior, theta uniform in the middle half of its prior."""
    k_u, k_t = jax.random.split(key)
    logit = jax.random.uniform(k_t, (2,), minval=-1.1, maxval=1.1)  # the middle half
    return {"u": jax.random.normal(k_u, cfg.particle_shape), "logit": logit}


@functools.partial(jax.jit, static_argnames=("cfg", "iterations"))
def climb(params, data, cfg, iterations=100, learning_rate=0.05):
    """Adam up log p: a start near the posterior's bulk, so warm-up spends less on the way.
    All iterations in one program: a host loop would compile twice (its first call's
    inputs are not yet laid out over the devices) and dispatch each update separately."""

    def adam(i, carry):
        params, m, v = carry
        g = jax.grad(log_density)(params, data, cfg)
        m = jax.tree.map(lambda m, g: 0.9 * m + 0.1 * g, m, g)
        v = jax.tree.map(lambda v, g: 0.999 * v + 0.001 * g**2, v, g)
        params = jax.tree.map(lambda p, m, v: p + up(m, v, i), params, m, v)
        return params, m, v

    def up(m, v, i):  # with the bias corrections of step i
        return learning_rate * (m / (1 - 0.9**i)) / (jnp.sqrt(v / (1 - 0.999**i)) + 1e-8)

    zeros = jax.tree.map(jnp.zeros_like, params)
    return jax.lax.fori_loop(1, iterations + 1, adam, (params, zeros, zeros))[0]


# the progress bar of the warm-up going on: its compiled program ticks it once per gradient
_WARM_UP_BAR = [None]


def _tick():
    if _WARM_UP_BAR[0] is not None:
        _WARM_UP_BAR[0].update(1)


# Compiled once for all chains: the data and the tuned parameters are arguments.
@functools.partial(jax.jit, static_argnames="run")
def _warm_up(key, params, data, run):
    def logp(params):  # each gradient evaluates it once: a tick per gradient
        jax.debug.callback(_tick)
        return log_density(params, data, run.cfg)

    return samplers.warm_up(run.sampler, key, logp, params, run.warmup, run.max_doublings)


@functools.partial(jax.jit, static_argnames="run")
def _sample(key, state, tuned, data, run):
    """One sampler step: the new state, (acceptance, gradients), the physical (w, theta)
    and the noise's power in the three lowest k bins."""
    logp = functools.partial(log_density, data=data, cfg=run.cfg)
    state, acceptance, gradients = samplers.step(
        run.sampler, key, state, tuned, logp, run.max_doublings
    )
    w, theta, _ = to_physical(state.position, run.cfg)
    low_power = distpm.power_spectrum(w, run.cfg, compensate=False)[1][:3]
    return state, (acceptance, gradients), (w, theta, low_power)


def run_chain(key, run: Run, data, chain: int):
    """One chain: a start, warm-up, then ``run.samples`` sampler steps; theta, the noise's
    lowest powers and statistics per sample, w summed, the tuned parameters."""
    k_start, k_warm, k_sample = jax.random.split(key, 3)
    params = climb(start(k_start, run.cfg), data, run.cfg)
    # the tuning decides how many gradients its steps take: the bar counts them, no total
    _WARM_UP_BAR[0] = tqdm(desc=f"chain {chain} {run.sampler} warm-up, {run.warmup} steps",
                           unit=" gradients")  # fmt: skip
    with _WARM_UP_BAR[0]:
        state, tuned, warmup_gradients = jax.block_until_ready(_warm_up(k_warm, params, data, run))
    _WARM_UP_BAR[0] = None
    thetas, powers, stats, w_sum = [], [], [], 0.0
    for key in tqdm(jax.random.split(k_sample, run.samples), desc=f"chain {chain} sampling"):
        state, (acceptance, gradients), (w, theta, power) = _sample(key, state, tuned, data, run)
        w_sum = w_sum + w
        thetas.append(np.asarray(theta))
        powers.append(np.asarray(power))
        stats.append((float(state.logdensity), float(acceptance), int(gradients)))
    tuned = {name: float(tuned[name]) for name in ("step_size", "L") if name in tuned}
    tuned["warmup_gradients"] = int(warmup_gradients)
    return np.array(thetas), np.array(powers), np.array(stats), w_sum, tuned


def correlation(a, b, cfg):
    k, p_ab, _ = distpm.power_spectrum(a, cfg, other=b, compensate=False)
    _, p_aa, _ = distpm.power_spectrum(a, cfg, compensate=False)
    _, p_bb, _ = distpm.power_spectrum(b, cfg, compensate=False)
    return np.asarray(k), np.asarray(p_ab / jnp.sqrt(p_aa * p_bb))


def summarise(thetas, powers, stats, tuned, w_mean, truth_noise, cfg, seconds):
    """R-hat, effective sizes and gradients per effective sample, the truth against the 95%
    region, r(k); as printed and saved. thetas (chains, samples, 2), powers (chains,
    samples, 3), stats (chains, samples, 3): log density, acceptance, gradients."""
    chains = jnp.asarray(thetas)
    rhat = None  # R-hat compares chains: none with one
    if len(thetas) > 1:
        rhat = np.asarray(blackjax.diagnostics.potential_scale_reduction(chains)).tolist()
    ess = np.asarray(blackjax.diagnostics.effective_sample_size(chains))
    ess_power = np.asarray(blackjax.diagnostics.effective_sample_size(jnp.asarray(powers)))
    gradients = float(stats[..., 2].sum())
    warmup_gradients = float(sum(t["warmup_gradients"] for t in tuned))
    acceptance = float(stats[..., 1].mean())  # NaN for MCLMC, which has none
    pooled = thetas.reshape(-1, 2)
    mean, cov = pooled.mean(0), np.cov(pooled.T)
    offset = np.array([TRUTH.Omega_m, TRUTH.sigma8]) - mean
    # undefined where the samples span no area (chains that did not move: a short smoke run)
    spread = np.all(np.linalg.eigvalsh(cov) > 1e-12 * np.trace(cov)) and np.trace(cov) > 0
    mahalanobis2 = float(offset @ np.linalg.solve(cov, offset)) if spread else float("nan")
    k, r = correlation(w_mean, truth_noise, cfg)
    summary = {
        "config": cfg.to_dict(),
        "sigma": SIGMA,
        "k_max": K_MAX,
        "truth": [TRUTH.Omega_m, TRUTH.sigma8],
        "posterior_mean": mean.tolist(),
        "posterior_sd": np.sqrt(np.diag(cov)).tolist(),
        "rhat": rhat,
        "ess": ess.tolist(),
        # the truth's squared Mahalanobis distance under a Gaussian fit of the samples:
        # inside the 95% region when below the chi^2 (2 dof) quantile 5.99
        "truth_mahalanobis2": None if np.isnan(mahalanobis2) else mahalanobis2,
        "truth_in_95": bool(mahalanobis2 < 5.991),  # False where undefined
        # and each parameter's central 95% interval (a prior bound can cut a Gaussian fit)
        "interval_95": np.percentile(pooled, [2.5, 97.5], axis=0).T.tolist(),
        # one estimator (BlackJAX's, over the chains) for theta and the noise's power
        "ess_low_power": ess_power.tolist(),
        "acceptance": None if np.isnan(acceptance) else acceptance,
        "gradients_per_sample": gradients / stats[..., 2].size,
        "gradients": gradients,
        "warmup_gradients": warmup_gradients,  # the Adam start's 100 per chain not counted
        # sampling's gradients per effective sample of Omega_m, sigma8, the three powers
        "gradients_per_ess": (gradients / np.concatenate([ess, ess_power])).tolist(),
        "tuned": tuned,
        "k": k.tolist(),
        "r": r.tolist(),
        # None where the box is too small for a bin below 0.1 h/Mpc (--smoke)
        "r_min_below_0.1": float(low.min()) if (low := r[(k > 0) & (k < 0.1)]).size else None,
        "seconds": seconds,
        "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "devices": list(Decomposition.of(cfg).grid),
    }
    for i, name in enumerate(NAMES):
        print(
            f"{name:8s} {mean[i]:.4f} +- {np.sqrt(cov[i, i]):.4f} (truth {summary['truth'][i]:.4f})"
            f"  R-hat {'n/a' if rhat is None else f'{rhat[i]:.3f}'}  ESS {ess[i]:.0f}"
        )
    print(f"truth inside the 95% region: {summary['truth_in_95']} (d^2 = {mahalanobis2:.2f})")
    for name, (lo, hi), true in zip(NAMES, summary["interval_95"], summary["truth"], strict=True):
        print(f"{name:8s} central 95%: [{lo:.4f}, {hi:.4f}], truth {true:.4f}")
    print(f"r(k) of the lowest bins: {np.round(r[:3], 3)} at k = {np.round(k[:3], 3)} h/Mpc")
    per_ess = ", ".join(f"{g:.0f}" for g in summary["gradients_per_ess"])
    print(f"gradients per effective sample (Omega_m, sigma8, noise power in 3 bins): {per_ess}")
    return summary


def plot(thetas, stats, summary, out):
    colours = ("C0", "C1")
    # one set of bins for all chains, wide enough for a chain that did not move
    pooled = thetas.reshape(-1, 2)
    lo, hi = pooled.min(0), pooled.max(0)
    pad = np.maximum(hi - lo, 1e-6 * np.maximum(np.abs(hi), 1)) * 0.05
    bins = [np.linspace(lo[i] - pad[i], hi[i] + pad[i], 26) for i in range(2)]
    fig, axes = plt.subplots(2, 2, figsize=(7, 7))
    for c, chain in enumerate(thetas):
        axes[1, 0].plot(chain[:, 0], chain[:, 1], ".", ms=3, color=colours[c % 2], alpha=0.6)
        for i in range(2):
            axes[i, i].hist(chain[:, i], bins=bins[i], histtype="step", color=colours[c % 2])
    for i in range(2):
        axes[i, i].axvline(summary["truth"][i], color="k", lw=1)
    axes[1, 0].plot(*summary["truth"], "k+", ms=14, mew=2, label="truth")
    axes[1, 0].set_xlabel(r"$\Omega_m$")
    axes[1, 0].set_ylabel(r"$\sigma_8$")
    axes[1, 1].set_xlabel(r"$\sigma_8$")
    axes[1, 0].legend()
    axes[0, 1].axis("off")
    fig.tight_layout()
    fig.savefig(out / "corner.png", dpi=110)

    fig, axes = plt.subplots(3, 1, figsize=(8, 7), sharex=True)
    for c, chain in enumerate(thetas):
        for i in range(2):
            axes[i].plot(chain[:, i], color=colours[c % 2], lw=0.8, label=f"chain {c}")
            axes[i].axhline(summary["truth"][i], color="k", lw=1)
            axes[i].set_ylabel(NAMES[i])
        axes[2].plot(stats[c, :, 0], color=colours[c % 2], lw=0.8)
    axes[2].set_ylabel("log density")
    axes[2].set_xlabel("sample")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(out / "traces.png", dpi=110)

    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(summary["k"], summary["r"], "o-")
    ax.axvline(K_MAX, color="gray", ls=":", label="scale cut of the likelihood")
    ax.set_xlabel(r"$k$ [$h\,\mathrm{Mpc}^{-1}$]")
    ax.set_ylabel("r(k): posterior-mean vs true noise")
    ax.set_ylim(-0.1, 1.05)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "correlation.png", dpi=110)


def main(run: Run, out: Path):
    began = time.perf_counter()
    cfg = run.cfg
    truth_noise, data = mock_data(cfg)
    # chain c's key does not depend on the number of chains: its first chains are the same
    keys = [jax.random.fold_in(jax.random.key(11), c) for c in range(run.chains)]
    results = [run_chain(key, run, data, c) for c, key in enumerate(keys)]
    thetas, powers, stats = (np.stack([r[i] for r in results]) for i in range(3))
    w_mean = sum(r[3] for r in results) / (run.chains * run.samples)
    tuned = [r[4] for r in results]
    seconds = time.perf_counter() - began
    summary = summarise(thetas, powers, stats, tuned, w_mean, truth_noise, cfg, seconds)
    summary["sampler"] = run.sampler
    np.savez(
        out / "chains.npz", theta=thetas, names=NAMES, low_power=powers,
        log_density=stats[..., 0], acceptance=stats[..., 1], gradients=stats[..., 2],
        posterior_mean_noise=w_mean,
    )  # fmt: skip
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    plot(thetas, stats, summary, out)
    print(f"{summary['seconds']:.0f} s, peak memory {summary['peak_rss_gib']:.2f} GiB")
    print(f"wrote chains.npz, summary.json, corner.png, traces.png, correlation.png in {out}")


if __name__ == "__main__":
    if ARGS.sampler not in samplers.SAMPLERS:
        raise SystemExit(f"--sampler must be one of {', '.join(samplers.SAMPLERS)}")
    run = SMOKE if ARGS.smoke else FULL
    run = dataclasses.replace(run, sampler=ARGS.sampler)
    if not ARGS.smoke:
        warmup, samples = LENGTHS[ARGS.sampler]
        run = dataclasses.replace(run, warmup=warmup, samples=samples)
    if ARGS.devices:
        run = dataclasses.replace(run, cfg=run.cfg.on(parse_devices(ARGS.devices)))
    for name in ("chains", "warmup", "samples"):
        if (value := getattr(ARGS, name)) is not None:
            if value < 1:
                raise SystemExit(f"--{name} must be at least 1, got {value}")
            run = dataclasses.replace(run, **{name: value})
    ARGS.out.mkdir(parents=True, exist_ok=True)
    main(run, ARGS.out)
