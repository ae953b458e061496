"""Make the figures of the documentation (``docs/figures/``, committed).

Each figure shows one check of ``docs/validation.md`` or one output a page describes, made from
distpm and the independent reference the tests use (colossus, CAMB, the Zel'dovich solution,
a converged run). About 5 minutes on a 2-core laptop:

    python docs/make_figures.py              # all of them
    python docs/make_figures.py zeldovich    # one (names: the functions below)
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from matplotlib.figure import Figure

import distpm
from distpm import background, halofit
from distpm.analysis import massfunction

ROOT = Path(__file__).resolve().parent.parent
FIGURES = ROOT / "docs" / "figures"
COSMO = distpm.Cosmology.planck18()


def _save(fig: Figure, name: str) -> None:
    fig.tight_layout()
    fig.savefig(FIGURES / name, dpi=90)
    print("wrote", FIGURES / name)


def first_run():
    """The default ``distpm run`` with P(k) inside the steps, multipoles and halos."""
    with tempfile.TemporaryDirectory() as out:
        options = ["--set", "halos=true", "--set", "output.power_every=5"]
        options += ["--set", "output.multipoles=true", "--no-progress", "--out", out]
        subprocess.run([sys.executable, "-m", "distpm.cli.main", "run", *options], check=True)
        for name in ("power", "density", "power_steps", "multipoles", "mass_function"):
            shutil.copy(Path(out) / f"{name}.png", FIGURES / f"first_run_{name}.png")


def examples():
    """Each script of ``examples/`` at its full size."""
    with tempfile.TemporaryDirectory() as out:
        for script, figure in (
            ("reconstruct_initial_conditions.py", "reconstruction.png"),
            ("growth_in_redshift_space.py", "growth_in_redshift_space.png"),
        ):
            subprocess.run([sys.executable, ROOT / "examples" / script, "--out", out], check=True)
            shutil.copy(Path(out) / figure, FIGURES / f"example_{figure}")


def field_level_inference():
    """The HMC example at full size (about 25 min on 2 CPU cores): its three figures, and its
    summary (R-hat, run time, peak memory) for benchmarks/README.md."""
    with tempfile.TemporaryDirectory() as out:
        script = ROOT / "examples" / "field_level_inference.py"
        subprocess.run([sys.executable, script, "--out", out], check=True)
        for figure in ("corner", "traces", "correlation"):
            shutil.copy(Path(out) / f"{figure}.png", FIGURES / f"example_inference_{figure}.png")
        shutil.copy(
            Path(out) / "summary.json",
            ROOT / "benchmarks" / "results" / "field_level_inference.json",
        )


def linear_theory():
    """Eisenstein-Hu P(k) and the growth D1(a) against colossus."""
    from colossus.cosmology import cosmology

    c = cosmology.setCosmology(
        "distpm-docs", flat=True, H0=100 * COSMO.h, Om0=COSMO.Omega_m, Ob0=COSMO.Omega_b,
        sigma8=COSMO.sigma8, ns=COSMO.n_s, relspecies=False,
    )  # fmt: skip
    c.power_model = "eisenstein98"
    k = np.geomspace(1e-3, 10, 400)
    a = np.linspace(0.05, 1.0, 100)
    ours_p = np.asarray(distpm.linear_power(jnp.asarray(k), COSMO, 1.0))
    ours_d = np.asarray(distpm.growth_factor(jnp.asarray(a), COSMO))
    fig = Figure(figsize=(10, 3.6))
    ax1, ax2 = fig.subplots(1, 2)
    ax1.semilogx(k, ours_p / c.matterPowerSpectrum(k, 0.0) - 1)
    ax1.set(xlabel="k [h/Mpc]", ylabel="P / P_colossus - 1", title="Eisenstein-Hu P(k), a = 1")
    ax2.plot(a, ours_d / (c.growthFactor(1 / a - 1)) - 1)
    ax2.set(xlabel="a", ylabel="D1 / D1_colossus - 1", title="linear growth D1(a)")
    _save(fig, "validation_linear_theory.png")


def zeldovich():
    """A PM plane wave against its Zel'dovich solution, at 64 and 256 cells per wavelength."""
    from distpm.parallel import Layout
    from distpm.state import Particles, lagrangian_block

    box = 256.0
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    with jax.enable_x64(True):
        table = background.growth_table(COSMO)
        for n in (64, 256):
            cfg = distpm.SimConfig(
                box_size=box, mesh_shape=(n, 2, 2), dtype="float64", parallel="1x1"
            )
            q, ids = lagrangian_block(cfg, Layout(cfg.particle_shape), jnp.float64)
            k = 2 * np.pi / box
            s = jnp.zeros_like(q).at[:, 0].set(0.5 / k * jnp.sin(k * q[:, 0]))

            def solution(a, s=s, q=q):
                d1, f1, _, _ = background.growth(a, table)
                return q + d1 * s, a**2 * background.E(a, COSMO) * f1 * d1 * s

            x0, p0 = solution(cfg.a_start)
            state = Particles(
                pos=x0 % box, vel=p0, ids=ids, mask=jnp.ones(len(q), bool), a=jnp.asarray(0.1)
            )
            out = distpm.evolve(state, COSMO, cfg)[-1]
            x1, _ = solution(1.0)
            error = (out.pos[:, 0] - x1[:, 0] + box / 2) % box - box / 2
            order = np.argsort(np.asarray(q[:, 0]))
            scale = float(jnp.max(jnp.abs(s)))
            ax.plot(np.asarray(q[order, 0]), np.asarray(error[order]) / scale, label=f"{n} cells")
    ax.set(xlabel="q [Mpc/h]", ylabel="(x - x_Zel'dovich) / max|s|",
           title="plane wave at half shell crossing, a = 1")  # fmt: skip
    ax.legend()
    _save(fig, "validation_zeldovich.png")


def initial_conditions():
    """P(k) of the initial particles against the linear P(k) at a_start."""
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    for fixed, label in ((True, "fixed amplitude"), (False, "Gaussian")):
        cfg = distpm.SimConfig(box_size=256.0, mesh_shape=64, fixed_amplitude=fixed, lpt_order=1)
        particles = distpm.initial_conditions(distpm.white_noise(1, cfg), COSMO, cfg)
        delta = distpm.density(particles, cfg)
        k, pk, modes = (np.asarray(v) for v in distpm.power_spectrum(delta, cfg))
        lin = np.asarray(distpm.linear_power(jnp.asarray(k), COSMO, cfg.a_start))
        keep = k < 0.5 * np.pi * 64 / 256.0
        ax.semilogx(k[keep], pk[keep] / lin[keep], "o-" if fixed else ".-", ms=3, label=label)
        if not fixed:
            band = 3 * np.sqrt(2 / modes[keep])
            ax.fill_between(k[keep], 1 - band, 1 + band, alpha=0.2, label="3 sigma cosmic variance")
    ax.axhline(1, color="k", lw=0.5)
    ax.set(xlabel="k [h/Mpc]", ylabel="P / P_lin(a_start)",
           title="Zel'dovich initial particles, 64^3, k < k_Nyq/2")  # fmt: skip
    ax.legend(fontsize=8)
    _save(fig, "validation_initial_conditions.png")


def halofit_against_camb():
    """distpm's halofit on CAMB's linear P(k) against CAMB's own halofit (Takahashi)."""
    import camb
    from scipy.interpolate import CubicSpline

    h = COSMO.h
    pars = camb.CAMBparams()
    pars.set_cosmology(H0=100 * h, ombh2=COSMO.Omega_b * h * h, omch2=COSMO.Omega_c * h * h,
                       mnu=0.0)  # fmt: skip
    pars.InitPower.set_params(ns=COSMO.n_s, As=2.1e-9)
    pars.set_matter_power(redshifts=(0.0, 1.0, 3.0), kmax=200.0, nonlinear=True)
    pars.NonLinearModel.set_params(halofit_version="takahashi")
    results = camb.get_results(pars)
    k, zs, p_lin = results.get_linear_matter_power_spectrum(hubble_units=True, k_hunit=True)
    _, _, p_nl = results.get_nonlinear_matter_power_spectrum(hubble_units=True, k_hunit=True)
    keep = k <= 10.0
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    with jax.enable_x64(True):
        for i, z in enumerate(zs):
            spline = CubicSpline(np.log(k), np.log(p_lin[i]))
            lnk = np.clip(halofit.LNK, np.log(k[0]), np.log(k[-1]))
            delta2 = np.exp(3 * lnk + spline(lnk)) / (2 * math.pi**2)
            scales = halofit.scales(jnp.asarray(halofit.LNK), jnp.asarray(delta2))
            a = 1.0 / (1.0 + z)
            om = float(background.Omega_m_of_a(jnp.asarray(a), COSMO))
            d2_lin = k[keep] ** 3 * p_lin[i, keep] / (2 * math.pi**2)
            d2 = halofit.halofit_delta2(k[keep], d2_lin, *scales, om, 1 - om, -1.0)
            ours = np.asarray(d2) * 2 * math.pi**2 / k[keep] ** 3
            ax.semilogx(k[keep], ours / p_nl[i, keep] - 1, label=f"z = {z:g}")
    ax.set(xlabel="k [h/Mpc]", ylabel="P_NL / P_NL,CAMB - 1", title="halofit against CAMB's")
    ax.legend()
    _save(fig, "validation_halofit.png")


def accuracy():
    """P/P_ref and r(k) of the settings against the converged run (benchmarks/accuracy.py)."""
    data = json.loads((ROOT / "benchmarks" / "results" / "accuracy.json").read_text())
    fig = Figure(figsize=(10, 3.8))
    ax1, ax2 = fig.subplots(1, 2)
    for row in data["defaults"]:
        if row["steps"] != 10:
            continue
        label = f"{row['N']}^3, mesh x{row['mesh_ratio']}, {row['paint']}"
        ax1.plot(data["k_fractions_of_nyquist"], np.asarray(row["ratio"]) - 1, "o-", label=label)
        ax2.plot(data["k_fractions_of_nyquist"], 1 - np.asarray(row["r"]), "o-", label=label)
    ax1.set(xlabel="k / k_Nyq (particle grid)", ylabel="P / P_ref - 1",
            title="10 steps against mesh x4, 40 steps")  # fmt: skip
    ax2.set(xlabel="k / k_Nyq (particle grid)", ylabel="1 - r", yscale="log",
            title="cross-correlation with the reference")  # fmt: skip
    ax1.legend(fontsize=7)
    _save(fig, "validation_accuracy.png")


def few_steps():
    """P/P_ref against the number of steps, per integrator (benchmarks/few_steps.py)."""
    data = json.loads((ROOT / "benchmarks" / "results" / "few_steps.json").read_text())
    fig = Figure(figsize=(10, 3.8))
    axes = fig.subplots(1, 2, sharey=True)
    for ax, at, name in zip(axes, (1, 2), ("k_Nyq/4", "k_Nyq/2"), strict=True):
        for integrator, color in (("fastpm", "C0"), ("2lpt", "C3")):
            for ratio, style in ((1, "o-"), (2, "s--")):
                rows = [
                    r for r in data["table"]
                    if r["N"] == 128 and r["lpt_order"] == 2 and r["integrator"] == integrator
                    and r["mesh_ratio"] == ratio
                ]  # fmt: skip
                steps = [r["steps"] for r in rows]
                ratios = [r["ratio"][at] - 1 for r in rows]
                ax.plot(steps, ratios, style, color=color, label=f"{integrator}, mesh x{ratio}")
        ax.axhline(0, color="k", lw=0.5)
        ax.set(xscale="log", xlabel="steps", title=f"128^3 in 256 Mpc/h, at {name}")
        ax.set_xticks([3, 5, 10, 20], labels=["3", "5", "10", "20"])
        ax.set_xticks([], minor=True)
    axes[0].set_ylabel("P / P_ref - 1")
    axes[0].legend(fontsize=8)
    _save(fig, "validation_few_steps.png")


def mass_function():
    """Halos of a 128^3 PM run: FoF masses against Watson et al. (2013), M200m against
    Tinker et al. (2008)."""
    cfg = distpm.SimConfig(mesh_shape=128, box_size=256.0, n_steps=10, parallel=(1, 1))
    run = distpm.simulate(distpm.white_noise(0, cfg), COSMO, cfg)
    cat = distpm.halo_catalogue(run, distpm.fof(run, cfg), COSMO, cfg)
    particle = cat.mass[0] / cat.n[0]
    # the test's bins above 100 members (the fit averaged over each bin, as there), and below
    edges = particle * np.array([20, 40, 60, 100, 141, 200, 283, 400, 1600])
    fig = Figure(figsize=(6, 3.8))
    ax = fig.subplots()
    for masses, model, label, marker in (
        (cat.mass, massfunction.watson_fof, "FoF / Watson et al. 2013", "o"),
        (cat.m200m, massfunction.tinker_200m, "M200m / Tinker et al. 2008", "s"),
    ):
        centres, dndlnm, error, counts = massfunction.measured(masses, 256.0**3, edges)
        fit = np.array([
            np.mean(model(np.geomspace(lo, hi, 9), COSMO, 1.0))
            for lo, hi in zip(edges[:-1], edges[1:], strict=True)
        ])  # fmt: skip
        keep = counts > 0
        ax.errorbar(centres[keep] / particle, dndlnm[keep] / fit[keep], error[keep] / fit[keep],
                    fmt=marker, mfc="none" if marker == "s" else None, label=label)  # fmt: skip
    ax.axhline(1, color="k", lw=0.5)
    ax.axvline(100, color="k", ls=":", lw=1)
    ax.legend(fontsize=8)
    ax.set(xscale="log", xlabel="halo members (M / particle mass)", ylabel="measured / fit",
           title="halos, 128^3 in 256 Mpc/h, 10 PM steps, mesh = particle grid")  # fmt: skip
    ax.set_xticks([20, 50, 100, 200, 500, 1000], labels=["20", "50", "100", "200", "500", "1000"])
    ax.set_xticks([], minor=True)
    _save(fig, "validation_mass_function.png")


def limber():
    """The full-sky convergence against Limber (benchmarks/limber.py)."""
    shutil.copy(ROOT / "benchmarks" / "results" / "limber.png", FIGURES / "validation_limber.png")


def tomography():
    """Two source planes' auto and cross spectra against Limber (benchmarks/tomography.py)."""
    shutil.copy(ROOT / "benchmarks" / "results" / "tomography.png",
                FIGURES / "validation_tomography.png")  # fmt: skip


def calibration():
    """The rank fractions of the field-level posterior's calibration (benchmarks/calibration.py)."""
    shutil.copy(ROOT / "benchmarks" / "results" / "calibration.png",
                FIGURES / "example_inference_calibration.png")  # fmt: skip


def lightcone_steps():
    """The 2LPT integrator's convergence C_ell in few steps (benchmarks/lightcone_steps.py)."""
    shutil.copy(ROOT / "benchmarks" / "results" / "lightcone_steps.png",
                FIGURES / "validation_lightcone_steps.png")  # fmt: skip


ALL = (first_run, examples, field_level_inference, linear_theory, zeldovich, initial_conditions,
       halofit_against_camb, accuracy, few_steps, mass_function, limber, tomography,
       calibration, lightcone_steps)  # fmt: skip

if __name__ == "__main__":
    FIGURES.mkdir(exist_ok=True)
    wanted = sys.argv[1:] or [f.__name__ for f in ALL]
    for function in ALL:
        if function.__name__ in wanted:
            function()
