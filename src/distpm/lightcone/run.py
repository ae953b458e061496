"""Lightcone runs: white noise -> particles -> convergence maps recorded on the way.

Every device records the crossings of its own particles into full maps;
the maps are summed over devices (and processes) at the end, never the
particles. Differentiable with respect to the noise and the cosmology
through the reverse-time adjoint (:mod:`distpm.integrate`): the maps'
cotangent enters every step of the backward pass, so memory does not grow
with the number of steps.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from distpm import ic, integrate, simulation
from distpm.lightcone import record
from distpm.lightcone.config import LightconeConfig
from distpm.parallel import migrate as parallel_migrate


@functools.partial(jax.jit, static_argnames=("cfg", "lc"))
def _record(state, cosmo, cfg, lc):
    recorder = record.Recorder(lc, cfg)

    def local(state, cosmo):
        layout = simulation.mesh_layout(cfg)
        state, needs = simulation._with_force(state, cosmo, layout, cfg)
        factors = integrate.step_factors(cosmo, cfg)
        shells, tab = record.tables(cosmo, cfg, lc)
        light = (recorder, shells, tab, recorder.empty_maps(cfg.float_dtype))
        state, step_needs, maps = integrate.run_steps(
            state, factors, cosmo, layout, cfg, cfg.a_stop, light
        )
        maps = {kind: layout.device_sum(m) for kind, m in maps.items()}
        return state, maps, layout.device_max(jnp.maximum(needs, step_needs))

    specs = (simulation.PARTICLES, P(), P())
    return simulation.sharded(local, cfg, (simulation.PARTICLES, P()), specs)(state, cosmo)


def lightcone(noise, cosmo, cfg, lc: LightconeConfig):
    """Run from white noise to a = 1, recording the observer's past lightcone.

    Returns (maps, particles at a = 1). ``maps`` holds, for each map ``lc``
    asks for, the Born convergence of every source, in the order of
    ``lc.source_redshifts`` then ``lc.distributions``:

    - ``"healpix"``: (n_sources, 12 nside^2), RING order;
      ``"healpix_counts"``: (12 nside^2,) crossings painted per pixel;
    - ``"flat"``: (n_sources, P, P), axis 0 along the gnomonic u = x / z,
      axis 1 along v = y / z; ``"flat_counts"``: (P, P).

    Counts are bilinear shares of particles (they sum to the number of
    particle images that crossed inside the map). See
    :mod:`distpm.lightcone.record` for the weights and conventions.
    """
    if not isinstance(lc, LightconeConfig):
        raise TypeError(f"lc must be a distpm.lightcone.LightconeConfig, got {type(lc)}")
    lc.check(cfg)
    cfg.check_runnable()
    ic.check_noise(noise, cfg)
    state = simulation.initial_conditions(noise, cosmo, cfg)
    state, maps, needs = _record(state, cosmo, cfg, lc)
    parallel_migrate.check_later(needs, cfg)
    out = {}
    for kind, m in maps.items():
        shape = (lc.flat_pixels, lc.flat_pixels) if kind == "flat" else m.shape[1:]
        out[kind] = m[1:].reshape(lc.n_sources, *shape)
        out[kind + "_counts"] = m[0].reshape(shape)
    return out, state
