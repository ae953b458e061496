"""Accuracy against a converged reference run of the same white noise.

The reference is distpm itself at a higher resolution: by default a mesh
4x finer than the particle grid and 40 steps (FastPM steps converge fast:
at 32^3 particles 40 and 80 steps give the same P(k) to 1e-3). The particle
grid, and so the white noise and the initial displacements, stay the same;
only the force resolution and the time steps change.

One subtlety: particle (i, j, l) starts at (i, j, l) L / N plus *half a mesh
cell* (see :func:`distpm.state.lagrangian_offset`), so two runs of the same
noise on different meshes are translated copies of each other. The
comparison undoes that offset before painting, else the translation alone
would decorrelate the two at high k (r = 0.74 at k_Nyq/2 for mesh ratios 1
against 8, with identical physics).

Both runs are painted on one measurement mesh (twice the particle grid,
CIC, window-compensated), so that the measurement's own aliasing is the
same in both and cancels in the ratios.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
import numpy as np

from distpm.analysis.power import power_spectrum
from distpm.simulation import density
from distpm.state import lagrangian_offset


def reference_config(cfg, *, mesh_factor: int = 4, n_steps: int = 40):
    """The converged reference of ``cfg``: a mesh ``mesh_factor`` x the particle grid.

    Keeps the particle grid, box, cosmology-independent options and the
    defaults of the force kernels ("auto"), so the reference uses what
    distpm recommends at its resolution.
    """
    mesh = tuple(mesh_factor * n for n in cfg.particle_shape)
    return cfg.replace(
        mesh_shape=mesh, n_steps=n_steps, compensate_force="auto", force_gradient="auto"
    )


def measurement_config(cfg):
    """Where both runs are painted: a CIC mesh twice the particle grid (1 device)."""
    return cfg.replace(mesh_shape=tuple(2 * n for n in cfg.particle_shape), paint="cic").on("1x1")


def _lattice_positions(particles, cfg) -> np.ndarray:
    """Positions by id [Mpc/h] with the run's Lagrangian offset removed (host, wrapped)."""
    pos = np.asarray(particles.by_id("pos"), dtype=np.float64) - lagrangian_offset(cfg)
    return np.mod(pos, np.asarray(cfg.box_size))


@dataclasses.dataclass(frozen=True)
class Comparison:
    """P(k) of a run against its reference, per k bin (host numpy arrays).

    k [h/Mpc] mean wavenumber of each bin; power, power_ref [(Mpc/h)^3];
    ratio = power / power_ref; r = P_cross / sqrt(P P_ref), the
    cross-correlation coefficient (1 for identical fields); k_nyquist
    [h/Mpc] of the particle grid (smallest over the axes).
    """

    k: np.ndarray
    power: np.ndarray
    power_ref: np.ndarray
    ratio: np.ndarray
    r: np.ndarray
    k_nyquist: float

    def at(self, k) -> int:
        """Index of the bin whose mean k is nearest ``k`` [h/Mpc]."""
        return int(np.argmin(np.abs(self.k - k)))

    def worst(self, k_max):
        """(max |ratio - 1|, min r) over the bins with k <= ``k_max`` [h/Mpc]."""
        sel = (self.k > 0) & (self.k <= k_max * (1 + 1e-6))
        return float(np.max(np.abs(self.ratio[sel] - 1))), float(np.min(self.r[sel]))


def compare(particles, cfg, reference, ref_cfg) -> Comparison:
    """Compare the final particles of a run (``cfg``) with a reference run (``ref_cfg``).

    Both must come from the same particle grid (and the same white noise
    for ``r`` to mean anything). Gathers the positions on the host: meant
    for tests and benchmarks, not for runs larger than one host's memory.
    """
    if tuple(cfg.particle_shape) != tuple(ref_cfg.particle_shape):
        raise ValueError(
            f"the run has particle_shape {cfg.particle_shape} and the reference "
            f"{ref_cfg.particle_shape}: compare runs of the same particle grid"
        )
    measure = measurement_config(cfg)
    run = jnp.asarray(_lattice_positions(particles, cfg), measure.float_dtype)
    ref = jnp.asarray(_lattice_positions(reference, ref_cfg), measure.float_dtype)
    d_run, d_ref = density(run, measure), density(ref, measure)
    k, p_run, _ = power_spectrum(d_run, measure)
    _, p_ref, _ = power_spectrum(d_ref, measure)
    _, p_cross, _ = power_spectrum(d_run, measure, other=d_ref)
    k, p_run, p_ref, p_cross = (np.asarray(x, dtype=np.float64) for x in (k, p_run, p_ref, p_cross))
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = p_run / p_ref
        r = p_cross / np.sqrt(p_run * p_ref)
    k_nyq = min(np.pi * n / b for n, b in zip(cfg.particle_shape, cfg.box_size, strict=True))
    return Comparison(k=k, power=p_run, power_ref=p_ref, ratio=ratio, r=r, k_nyquist=k_nyq)
