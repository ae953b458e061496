"""Public entry points: initial conditions -> N-body steps -> density.

All functions are jitted with ``cfg`` static and are differentiable with
respect to the noise and the cosmology.
"""

from __future__ import annotations

import functools

import jax

from distpm import ic, integrate
from distpm.gravity import force, paint_density
from distpm.parallel import Layout
from distpm.state import Particles, wrap

_jit = functools.partial(jax.jit, static_argnames=("cfg",))


def mesh_layout(cfg) -> Layout:
    """The layout of the PM mesh for ``cfg``."""
    return Layout(cfg.mesh_shape)


@_jit
def initial_conditions(noise, cosmo, cfg) -> Particles:
    """LPT particles at ``cfg.a_start`` from white noise (``acc`` left at zero).

    noise: ``cfg.particle_shape`` array of N(0, 1) values (see
    :func:`distpm.white_noise`); any real array of that shape is accepted,
    which is what inference optimises over.
    """
    return ic.lpt(ic.linear_modes(noise, cosmo, cfg), cosmo, cfg)


@_jit
def _evolve(state, cosmo, cfg) -> list[Particles]:
    layout = mesh_layout(cfg)
    pos = wrap(state.pos, cfg.box_size)
    state = state.replace(pos=pos, acc=force(pos, cosmo, layout, cfg))
    factors = integrate.step_factors(cosmo, cfg)
    grid = cfg.time_grid
    out = []
    for start, stop in integrate.segments(cfg):
        state = integrate.run_steps(state, factors[start:stop], cosmo, layout, cfg, grid[stop])
        out.append(state)
    return out


def evolve(state: Particles, cosmo, cfg) -> list[Particles]:
    """Evolve particles from ``cfg.a_start``; return them at each snapshot and at a_stop.

    state: particles at ``cfg.a_start`` (``pos`` [Mpc/h], wrapped into the
    box; ``vel`` canonical momenta); its ``acc`` is ignored and recomputed.
    """
    cfg.check_dtype_enabled()
    if (
        not isinstance(state.a, jax.core.Tracer)
        and abs(float(state.a) - cfg.a_start) > 1e-6 * cfg.a_start
    ):
        raise ValueError(
            f"state.a = {float(state.a)} but cfg.a_start = {cfg.a_start}: evolve starts at a_start"
        )
    n = cfg.n_particles
    for name in ("pos", "vel"):
        shape = tuple(getattr(state, name).shape)
        if shape != (n, 3):
            raise ValueError(
                f"state.{name} has shape {shape}, expected ({n}, 3) "
                f"for {cfg.particle_shape} particles"
            )
    return _evolve(state, cosmo, cfg)


def simulate_snapshots(noise, cosmo, cfg) -> list[Particles]:
    """Particles at each of ``cfg.snapshots`` and at ``cfg.a_stop``, in time order."""
    cfg.check_dtype_enabled()
    ic.check_noise(noise, cfg)
    return _evolve(initial_conditions(noise, cosmo, cfg), cosmo, cfg)


def simulate(noise, cosmo, cfg) -> Particles:
    """Run the simulation from white noise; return the particles at ``cfg.a_stop``.

    Particles are in Lagrangian-grid order: ``pos`` [Mpc/h], ``vel``
    [100 km/s] canonical momentum a^2 dx/dt (peculiar velocity = vel / a),
    ``acc`` the force at the final positions, ``a`` the scale factor.
    """
    return simulate_snapshots(noise, cosmo, cfg)[-1]


@_jit
def _density(pos, cfg):
    return paint_density(pos, mesh_layout(cfg), cfg) - 1.0


def density(pos, cfg):
    """Density contrast delta on the PM mesh from positions (n, 3) [Mpc/h].

    Mass assignment with ``cfg.paint``; every particle carries the mean mass,
    so delta averages to zero.
    """
    pos_shape = tuple(getattr(pos, "shape", ()))
    if len(pos_shape) != 2 or pos_shape[1] != 3:
        raise ValueError(f"pos must have shape (n, 3), got {pos_shape}")
    if pos_shape[0] != cfg.n_particles:
        raise ValueError(
            f"pos holds {pos_shape[0]} particles but the config has "
            f"{cfg.n_particles} = prod{cfg.particle_shape}"
        )
    return _density(pos, cfg)
