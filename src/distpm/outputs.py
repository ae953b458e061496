"""The files of a run's outputs: at each output time its P(k) beside the linear and halofit
spectra, plots, a snapshot, redshift-space multipoles, and at the end its fields and halos;
the files of the observers' results (lightcone maps and spectra, P(k) every N steps).
Written by process 0; each returns the names it wrote. Called by :mod:`distpm.pipeline`.
"""

from __future__ import annotations

from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

from distpm import halofit, simulation
from distpm.analysis import redshift
from distpm.analysis.power import multipoles, power_spectrum
from distpm.background import growth_rate
from distpm.ic import white_noise
from distpm.io import gadget, groups, partial
from distpm.linear_power import resolved
from distpm.parallel import runtime
from distpm.runfile import HalosConfig
from distpm.state import Particles


def check_finite(state: Particles):
    """Raise if the state holds NaN or inf (e.g. from a bad cosmology)."""
    for name in ("pos", "vel"):
        if not bool(jnp.all(jnp.isfinite(getattr(state, name)))):
            raise FloatingPointError(f"non-finite particle {name} at a={float(state.a):.4f}")


def write_power(path: Path, k, p, n_modes, p_lin, p_nl):
    """The measured P(k) of the filled bins next to the linear and the halofit spectra."""
    header = "k [h/Mpc]  P [(Mpc/h)^3]  n_modes  P_lin(a) [(Mpc/h)^3]  P_halofit(a) [(Mpc/h)^3]"
    filled = np.asarray(n_modes) > 0
    table = np.column_stack([np.asarray(x)[filled] for x in (k, p, n_modes, p_lin, p_nl)])
    with partial.writing(path) as temporary:
        np.savetxt(temporary, table, header=header, fmt=["%.6e", "%.6e", "%d", "%.6e", "%.6e"])


SLAB_DEPTH = 0.25  # density images average the first quarter of the z axis


def write_halos(out, cat, cosmo, cfg, halos: HalosConfig) -> list[str]:
    """The catalogue (npz and text) and the mass-function plot; the names written."""
    from distpm import plots

    about = {"linking_length": halos.linking_length, "min_members": halos.min_members}
    names = cat.save(out / "halos", opened=partial.opened, **about)
    plots.save(
        plots.mass_function_plot(cat, cosmo, cfg, halos.min_members), out / "mass_function.png"
    )
    return [*names, "mass_function.png"]


def write_outputs(
    out, state, number, final, cosmo, cfg, output, save_fields, halos=None
) -> list[str]:
    """Spectra, plots, a snapshot (and fields and halos at the end) of one output time; the
    names written. ``halos``: (labels, catalogue) of the final snapshot: the largest are
    marked on its density image, and a Gadget-4 snapshot comes with their catalogue."""
    from distpm import plots  # matplotlib only when outputs are written

    main = runtime.is_main_process()
    check_finite(state)
    a = float(state.a)
    delta = simulation.density(state, cfg, migrate=False)  # the steps left them on their owners
    k, p, n_modes = (runtime.to_host(x) for x in power_spectrum(delta, cfg))
    spectrum = resolved(cfg.linear_power)  # the one the initial conditions used
    p_lin = np.asarray(spectrum(k, cosmo, a))
    k_safe = np.where(k > 0, k, 1.0)  # empty bins: dropped from the table
    p_nl = np.asarray(halofit.nonlinear_power(k_safe, cosmo, a, spectrum=spectrum))
    depth = max(1, int(cfg.mesh_shape[2] * SLAB_DEPTH))
    slab = runtime.to_host(jnp.mean(delta[:, :, :depth], axis=2))
    fields = {}
    if save_fields and final:
        fields = {"density.npy": delta, "white_noise.npy": white_noise(cfg.seed, cfg)}
        fields = {name: runtime.to_host(x) for name, x in fields.items()}
    suffix = "" if final else f"_a{a:.4f}"
    names = [f"power{suffix}.txt", f"power{suffix}.png", f"density{suffix}.png", *fields]
    if main:
        write_power(out / names[0], k, p, n_modes, p_lin, p_nl)
        plots.save(plots.power_plot(k, p, n_modes, p_lin, a, cfg, p_nl=p_nl), out / names[1])
        cat = None if halos is None else halos[1]
        plots.save(plots.density_image(slab, a, cfg, SLAB_DEPTH, halos=cat), out / names[2])
        for name, x in fields.items():
            with partial.opened(out / name) as f:
                np.save(f, x)
    if output.multipoles:
        names += write_multipoles(out, state, suffix, cosmo, cfg, output.line_of_sight)
    if output.snapshot_format == "gadget4" and halos is not None:
        groups.write_groups(
            out, state, *halos, cosmo, cfg, number=number, double=output.snapshot_double
        )
        names += [f"snapdir_{number:03d}", f"groups_{number:03d}"]
    elif output.snapshot_format == "gadget4":
        snapdir = f"snapdir_{number:03d}"
        gadget.write_snapshot(
            out / snapdir, state, cosmo, cfg, number=number, double=output.snapshot_double
        )
        names.append(snapdir)
    return names


def write_multipoles(out, state, suffix, cosmo, cfg, axis_name) -> list[str]:
    """Redshift-space P0, P2, P4 along ``axis_name`` next to Kaiser's prediction from the
    linear and the halofit P(k); the names written."""
    from distpm import plots

    axis = redshift.AXES[axis_name]
    moved = simulation.density(redshift.redshift_space(state, cosmo, cfg, axis=axis), cfg)
    k, p, n_modes = (runtime.to_host(x) for x in multipoles(moved, cfg, axis=axis))
    filled = n_modes > 0
    k, p, n_modes = k[filled], p[:, filled], n_modes[filled]
    a, spectrum = float(state.a), resolved(cfg.linear_power)
    f = float(growth_rate(np.float32(a), cosmo))
    theory = [np.asarray(spectrum(k, cosmo, a))]
    theory.append(np.asarray(halofit.nonlinear_power(k, cosmo, a, spectrum=spectrum)))
    kaiser = [[redshift.kaiser(t, f, ell) for ell in (0, 2, 4)] for t in theory]
    names = [f"multipoles{suffix}.txt", f"multipoles{suffix}.png"]
    if runtime.is_main_process():
        header = (
            f"line of sight {axis_name}, a = {a:.6g}, f = {f:.6g}; k [h/Mpc]  P0  P2  P4  "
            "n_modes  Kaiser P0 P2 P4 of P_lin  Kaiser P0 P2 P4 of P_halofit [(Mpc/h)^3]"
        )
        table = np.column_stack([k, *p, n_modes, *kaiser[0], *kaiser[1]])
        with partial.opened(out / names[0]) as f:
            np.savetxt(f, table, header=header, fmt="%.6e")
        plots.save(plots.multipoles_plot(k, p, kaiser, a, axis_name, cfg), out / names[1])
    return names


def write_observed(out, observers, results, cosmo, cfg, lightcone) -> list[str]:
    """The files of the observers' results: with a lightcone, its maps and spectra (its
    observers come first); P(k) every N steps."""
    from distpm import plots  # matplotlib only when outputs are written

    results = [jax.tree.map(runtime.to_host, r) for r in results]
    if not runtime.is_main_process():
        return []
    written = []
    if lightcone is not None:
        from distpm.lightcone import output as lightcone_output  # healpy

        maps, rows = results[:2]
        k, a, p = observers[1].table(rows)
        written += lightcone_output.write_lightcone(out, maps, (a, k, p), cosmo, cfg, lightcone)
    if len(results) > 2 * (lightcone is not None):
        power_steps, rows = observers[-1], results[-1]
        k, a, p = power_steps.table(rows)
        with partial.opened(out / "power_steps.txt") as f:
            power_steps.write(f, rows)
        plots.save(plots.power_steps_plot(k, a, p, cosmo, cfg), out / "power_steps.png")
        written += ["power_steps.txt", "power_steps.png"]
    return written
