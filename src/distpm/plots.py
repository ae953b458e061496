"""The figures of ``distpm run``: P(k) with its ratio to linear theory, a density image
(with the largest halos marked), the halo mass function, P(k) over time, redshift-space
multipoles, and the lightcone's maps (sphere and flat field, with the shear) and C_ell.

Each function takes arrays and returns a :class:`matplotlib.figure.Figure`, made
without pyplot: no global state, any backend (a notebook shows the figure it
gets back); :func:`save` writes one to a file.
"""

from __future__ import annotations

from pathlib import Path

import matplotlib
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Circle

from distpm.io import partial


def save(fig: Figure, path, dpi: int = 120):
    """Write ``fig`` to ``path`` (the format from its suffix), under a temporary name until it
    is complete (:func:`distpm.io.partial.writing`)."""
    path = Path(path)
    with partial.writing(path) as temporary:
        fig.savefig(temporary, dpi=dpi, format=path.suffix.lstrip("."))


def power_plot(k, p, n_modes, p_lin, a, cfg, p_nl=None):
    """Two panels: P(k) with the linear and (if given) halofit P(k) (log-log), and each over
    P_lin."""
    filled = np.asarray(n_modes) > 0
    k, p, p_lin = (np.asarray(x)[filled] for x in (k, p, p_lin))
    fig = Figure(figsize=(6, 6))
    top, bottom = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    top.loglog(k, p, "o-", ms=3, label="distpm")
    top.loglog(k, p_lin, "k--", label="linear theory")
    if p_nl is not None:
        p_nl = np.asarray(p_nl)[filled]
        top.loglog(k, p_nl, "k:", label="halofit (Takahashi et al. 2012)")
        bottom.semilogx(k, p_nl / p_lin, "k:")
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
    return fig


def density_image(slab, a, cfg, depth_fraction, halos=None, n_marked=10):
    """log10(1 + delta) of ``slab``, delta averaged over the first ``depth_fraction`` of z.

    halos: a :class:`distpm.HaloCatalogue`; the ``n_marked`` most massive
    halos whose centres lie in the slab are circled (radius 3 r_rms).
    """
    fig = Figure(figsize=(6, 5.2))
    ax = fig.subplots()
    lx, ly = cfg.box_size[0], cfg.box_size[1]
    image = ax.imshow(
        np.log10(np.maximum(1 + slab, 1e-3)).T, origin="lower", extent=(0, lx, 0, ly), cmap="magma"
    )
    fig.colorbar(image, ax=ax, label=r"$\log_{10}(1+\delta)$")
    ax.set_xlabel("x [Mpc/h]")
    ax.set_ylabel("y [Mpc/h]")
    ax.set_title(f"a = {a:.3f}, slab {depth_fraction * cfg.box_size[2]:g} Mpc/h deep")
    if halos is not None and len(halos):
        inside = np.flatnonzero(halos.pos[:, 2] < depth_fraction * cfg.box_size[2])[:n_marked]
        for i in inside:
            x, y = halos.pos[i, :2]
            ax.add_patch(Circle((x, y), 3 * halos.r_rms[i], fill=False, color="cyan", lw=1))
        if len(inside):
            ax.plot([], [], "o", mfc="none", color="cyan", label=f"{len(inside)} largest halos")
            ax.legend(loc="upper right", fontsize=8)
        ax.set_xlim(0, lx)
        ax.set_ylim(0, ly)
    fig.tight_layout()
    return fig


def mass_function_plot(halos, cosmo, cfg, min_members):
    """Measured dn/dlnM with Poisson errors against the Watson et al. (2013) FoF and
    Sheth-Tormen fits, and their ratio to Watson's; with the spherical-overdensity masses,
    their M200m against Tinker et al. (2008)."""
    from distpm.analysis import massfunction
    from distpm.linear_power import resolved

    spectrum = resolved(cfg.linear_power)  # the one the initial conditions used

    particle = massfunction.mean_density(cosmo) * np.prod(cfg.box_size) / cfg.n_particles
    largest = float(halos.mass.max()) if len(halos) else 0.0  # a run may find no halo
    top = max(largest, 2 * min_members * particle)
    edges = np.geomspace(min_members * particle, top * 1.001, 13)
    centres, dn, err, counts = massfunction.measured(halos.mass, np.prod(cfg.box_size), edges)
    fine = np.geomspace(edges[0], edges[-1], 60)
    watson = massfunction.watson_fof(fine, cosmo, halos.a, spectrum=spectrum)
    fig = Figure(figsize=(6, 6))
    upper, lower = fig.subplots(2, 1, sharex=True, gridspec_kw={"height_ratios": [2, 1]})
    seen = counts > 0
    upper.errorbar(centres[seen], dn[seen], err[seen], fmt="o", ms=4, label="distpm FoF")
    upper.loglog(fine, watson, "k-", label="Watson et al. 2013 (FoF)")
    tormen = massfunction.sheth_tormen(fine, cosmo, halos.a, spectrum=spectrum)
    upper.loglog(fine, tormen, "k--", label="Sheth-Tormen")
    so = np.isfinite(halos.m200m).all() and len(halos) > 0
    if so:
        _, dn_so, err_so, counts_so = massfunction.measured(
            halos.m200m, np.prod(cfg.box_size), edges
        )
        seen_so = counts_so > 0
        upper.errorbar(centres[seen_so], dn_so[seen_so], err_so[seen_so], fmt="s", ms=4,
                       mfc="none", label="distpm M200m")  # fmt: skip
        tinker = massfunction.tinker_200m(fine, cosmo, halos.a, spectrum=spectrum)
        upper.loglog(fine, tinker, "k-.", label="Tinker et al. 2008 (M200m)")
    upper.set_ylabel(r"$dn/d\ln M$ [$h^3\,\mathrm{Mpc}^{-3}$]")
    upper.set_title(
        f"a = {halos.a:.3f}, {len(halos)} halos of >= {min_members} particles "
        f"({particle:.3g} $10^{{10}} M_\\odot/h$ each)"
    )
    upper.legend(fontsize=8)
    fit = massfunction.watson_fof(centres, cosmo, halos.a, spectrum=spectrum)
    lower.errorbar(centres[seen], dn[seen] / fit[seen], err[seen] / fit[seen], fmt="o", ms=4)
    if so:
        fit_so = massfunction.tinker_200m(centres, cosmo, halos.a, spectrum=spectrum)
        ratio, error = dn_so[seen_so] / fit_so[seen_so], err_so[seen_so] / fit_so[seen_so]
        lower.errorbar(centres[seen_so], ratio, error, fmt="s", ms=4, mfc="none")
    lower.axhline(1.0, color="k", lw=0.8)
    lower.axvline(100 * particle, color="grey", ls=":", lw=0.8)
    lower.set_xscale("log")
    lower.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    lower.set_xlabel(r"$M$ [$10^{10} M_\odot/h$]  (dotted: 100 particles)")
    lower.set_ylabel("/ Watson (FoF), / Tinker (M200m)" if so else "/ Watson")
    fig.tight_layout()
    return fig


def power_steps_plot(k, a, p, cosmo, cfg):
    """P(k) at every measured time, and its growth at the largest scales against linear
    theory's (D(a) / D(a_end))^2."""
    from distpm.background import growth_factor

    fig = Figure(figsize=(11, 4.5))
    left, right = fig.subplots(1, 2)
    colours = matplotlib.colormaps["viridis"](np.linspace(0, 1, len(a)))
    for p_i, c in zip(p, colours, strict=True):
        left.loglog(k, p_i, color=c, lw=1)
    scale = matplotlib.cm.ScalarMappable(matplotlib.colors.Normalize(a[0], a[-1]), "viridis")
    bar = fig.colorbar(scale, ax=left)
    bar.set_label("scale factor a")
    left.set_xlabel(r"$k$ [$h\,\mathrm{Mpc}^{-1}$]")
    left.set_ylabel(r"$P(k)$ [$(h^{-1}\mathrm{Mpc})^3$]")
    left.set_title(f"P(k) inside the run, {len(a)} times")
    d = np.asarray(growth_factor(np.asarray(a, dtype=np.float32), cosmo))
    right.plot(a, (d / d[-1]) ** 2, "k--", label=r"linear: $(D/D_\mathrm{end})^2$")
    for j in range(min(3, len(k))):
        right.plot(a, p[:, j] / p[-1, j], "o-", ms=3, label=f"k = {k[j]:.3f} h/Mpc")
    right.set_xlabel("scale factor a")
    right.set_ylabel(r"$P(k, a) / P(k, a_\mathrm{end})$")
    right.set_title("growth of the largest scales")
    right.legend()
    fig.tight_layout()
    return fig


def multipoles_plot(k, p, kaiser, a, axis_name, cfg):
    """k P_l(k) of l = 0, 2, 4 in redshift space, with Kaiser's prediction from the linear
    (dashed) and the halofit (dotted) P(k)."""
    fig = Figure(figsize=(6, 4.5))
    ax = fig.subplots()
    for ell, p_ell, lin, nl in zip((0, 2, 4), p, *kaiser, strict=True):
        line = ax.plot(k, k * p_ell, "o-", ms=3, label=f"$P_{ell}$")[0]
        ax.plot(k, k * lin, "--", color=line.get_color(), lw=1)
        ax.plot(k, k * nl, ":", color=line.get_color(), lw=1.5)
    ax.plot([], [], "k--", lw=1, label="Kaiser, linear P")
    ax.plot([], [], "k:", lw=1.5, label="Kaiser, halofit P")
    ax.set_xscale("log")
    ax.axhline(0.0, color="k", lw=0.5)
    ax.set_xlabel(r"$k$ [$h\,\mathrm{Mpc}^{-1}$]")
    ax.set_ylabel(r"$k\,P_\ell(k)$ [$(h^{-1}\mathrm{Mpc})^2$]")
    ax.set_title(f"redshift space along {axis_name}, a = {a:.3f}, {cfg.particle_shape[0]}$^3$")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def sky_maps(maps, titles, xsize: int = 800):
    """HEALPix maps (RING order) in Mollweide projection, one per row."""
    import healpy

    nside = healpy.npix2nside(len(maps[0]))
    projector = healpy.projector.MollweideProj(xsize=xsize)
    fig = Figure(figsize=(8, 4 * len(maps)))
    for ax, m, title in zip(fig.subplots(len(maps), 1, squeeze=False)[:, 0], maps, titles,
                            strict=True):  # fmt: skip
        flat = projector.projmap(np.asarray(m), lambda x, y, z: healpy.vec2pix(nside, x, y, z))
        image = ax.imshow(np.ma.masked_invalid(flat), origin="lower", cmap="magma",
                          extent=projector.get_extent())  # fmt: skip
        ax.set_axis_off()
        ax.set_title(title)
        fig.colorbar(image, ax=ax, orientation="horizontal", shrink=0.6, pad=0.02)
    return fig


def flat_maps(maps, fov_deg, titles, shear=None, arrows: int = 24):
    """Flat-sky maps (P, P) of a field ``fov_deg`` wide, side by side; with ``shear`` =
    (g1, g2) (each like ``maps``), headless sticks along the shear's stretch, of length
    |gamma|, on an ``arrows`` x ``arrows`` grid."""
    half, p = fov_deg / 2, maps[0].shape[-1]
    step = max(1, p // arrows)
    centres = (np.arange(0, p, step) + step / 2) / p * fov_deg - half
    fig = Figure(figsize=(4.5 * len(maps), 4))
    for i, ax in enumerate(fig.subplots(1, len(maps), squeeze=False)[0]):
        image = ax.imshow(maps[i].T, origin="lower", extent=(-half, half, -half, half),
                          cmap="magma")  # fmt: skip
        if shear is not None:
            a, b = (g[i][::step, ::step] for g in shear)
            size, angle = np.hypot(a, b), 0.5 * np.arctan2(b, a)  # stretch along angle from u
            ax.quiver(*np.meshgrid(centres, centres, indexing="ij"), size * np.cos(angle),
                      size * np.sin(angle), color="w", headwidth=0, headlength=0,
                      headaxislength=0, pivot="middle", width=0.004)  # fmt: skip
        ax.set_title(titles[i])
        ax.set_xlabel("u [deg]")
        ax.set_ylabel("v [deg]")
        fig.colorbar(image, ax=ax, shrink=0.8)
    fig.tight_layout()
    return fig


def convergence_spectra_plot(panels):
    """One panel per map kind: each source's measured C_ell^kappa with Limber's of the
    linear, the halofit and (where given) the run's measured P(k).

    panels: {kind: (ell, [(label, C_ell, linear, halofit, measured or None), ...])}."""
    fig = Figure(figsize=(6 * len(panels), 4.5))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (kind, (ell, sources)) in zip(axes, panels.items(), strict=True):
        for label, cl, lin, nonlinear, measured in sources:
            (line,) = ax.loglog(ell, cl, lw=1, label=f"distpm, {label}")
            colour = line.get_color()
            ax.loglog(ell, lin, "--", color=colour, lw=1, label="Limber, linear P")
            ax.loglog(ell, nonlinear, "-.", color=colour, lw=1, label="Limber, halofit P")
            if measured is not None:
                ax.loglog(ell, measured, ":", color=colour, lw=1.5, label="Limber, measured P")
        ax.set_xlabel(r"$\ell$")
        ax.set_ylabel(r"$C_\ell^{\kappa\kappa}$")
        ax.set_title(f"{kind} map")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return fig


def pair_spectra_plot(ell, panels):
    """One panel per pair of sources: C_ell of kappa, of the shear's E and B modes, and
    Limber's kappa C_ell of the measured and the halofit P(k).

    panels: [(title, C_kappa, C_E, C_B, Limber measured, Limber halofit), ...]."""
    fig = Figure(figsize=(4.5 * len(panels), 4))
    axes = fig.subplots(1, len(panels), squeeze=False)[0]
    for ax, (title, kk, ee, bb, measured, halofit) in zip(axes, panels, strict=True):
        ax.loglog(ell, np.abs(kk), lw=1, label=r"$\kappa\kappa$")
        ax.loglog(ell, np.abs(ee), lw=1, label="EE")
        ax.loglog(ell, np.abs(bb), lw=1, label="|BB|")
        ax.loglog(ell, measured, "k:", lw=1.5, label="Limber, measured P")
        ax.loglog(ell, halofit, "k-.", lw=1, label="Limber, halofit P")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel(r"$\ell$")
    axes[0].set_ylabel(r"$C_\ell$")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    return fig
