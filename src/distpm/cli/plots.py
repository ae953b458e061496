"""Plots written by ``distpm run``: P(k) with its ratio to linear theory, a density image."""

from __future__ import annotations

import matplotlib
import matplotlib.ticker

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402


def power_plot(path, k, p, n_modes, p_lin, a, cfg):
    """Two panels: P(k) and linear P(k) (log-log), and P / P_lin."""
    filled = np.asarray(n_modes) > 0
    k, p, p_lin = (np.asarray(x)[filled] for x in (k, p, p_lin))
    fig, (top, bottom) = plt.subplots(
        2, 1, figsize=(6, 6), sharex=True, gridspec_kw={"height_ratios": [2, 1]}
    )
    top.loglog(k, p, "o-", ms=3, label="distpm")
    top.loglog(k, p_lin, "k--", label="linear theory")
    top.set_ylabel(r"$P(k)$ [$(h^{-1}\mathrm{Mpc})^3$]")
    top.set_title(
        f"a = {a:.3f}, {cfg.particle_shape[0]}$^3$ particles, "
        f"{cfg.box_size[0]:g} Mpc/h, {cfg.n_steps} steps"
    )
    top.legend()
    bottom.semilogx(k, p / p_lin, "o-", ms=3)
    bottom.axhline(1.0, color="k", lw=0.8)
    bottom.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    bottom.set_xlabel(r"$k$ [$h\,\mathrm{Mpc}^{-1}$]")
    bottom.set_ylabel(r"$P / P_\mathrm{lin}$")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def density_image(path, slab, a, cfg, depth_fraction):
    """log10(1 + delta) of ``slab``, delta averaged over the first ``depth_fraction`` of z."""
    fig, ax = plt.subplots(figsize=(6, 5.2))
    lx, ly = cfg.box_size[0], cfg.box_size[1]
    image = ax.imshow(
        np.log10(np.maximum(1 + slab, 1e-3)).T, origin="lower", extent=(0, lx, 0, ly), cmap="magma"
    )
    fig.colorbar(image, ax=ax, label=r"$\log_{10}(1+\delta)$")
    ax.set_xlabel("x [Mpc/h]")
    ax.set_ylabel("y [Mpc/h]")
    ax.set_title(f"a = {a:.3f}, slab {depth_fraction * cfg.box_size[2]:g} Mpc/h deep")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
