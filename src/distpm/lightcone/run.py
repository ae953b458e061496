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
    n_out = len(integrate.segments(cfg))

    def local(state, cosmo):
        layout = simulation.mesh_layout(cfg)
        needs = parallel_migrate.no_needs()
        factors = integrate.step_factors(cosmo, cfg)
        shells, tab = record.tables(cosmo, cfg, lc)
        maps = recorder.empty_maps(cfg.float_dtype)
        grid, states = cfg.time_grid, []
        for start, stop in integrate.segments(cfg):
            light = (recorder, shells[start:stop], tab, maps)
            state, step_needs, maps = integrate.run_steps(
                state, factors[start:stop], cosmo, layout, cfg, grid[stop], light
            )
            needs = jnp.maximum(needs, step_needs)
            states.append(state)
        maps = recorder.normalise({kind: layout.device_sum(m) for kind, m in maps.items()})
        return states, maps, layout.device_max(needs)

    specs = ([simulation.PARTICLES] * n_out, P(), P())
    return simulation.sharded(local, cfg, (simulation.PARTICLES, P()), specs)(state, cosmo)


def lightcone(noise, cosmo, cfg, lc: LightconeConfig):
    """Run from white noise to a = 1, recording the observer's past lightcone.

    Returns (maps, particles): the particles at each of ``cfg.snapshots``
    and at a = 1, in time order (as :func:`distpm.simulate_snapshots`), and
    for each map ``lc`` asks for, the Born convergence of every source, in
    the order of ``lc.source_redshifts`` then ``lc.distributions``:

    - ``"healpix"``: (n_sources, 12 nside^2), RING order;
      ``"healpix_counts"``: (12 nside^2,) crossings painted per pixel;
    - ``"flat"``: (n_sources, P, P), axis 0 along the gnomonic u = x / z,
      axis 1 along v = y / z; ``"flat_counts"``: (P, P).

    Counts are bilinear shares of particles (they sum to the number of
    particle images that crossed inside the map; divide by
    :func:`distpm.lightcone.sky.response` for a density per steradian).
    See :mod:`distpm.lightcone.record` for the weights and conventions.
    """
    if not isinstance(lc, LightconeConfig):
        raise TypeError(f"lc must be a distpm.lightcone.LightconeConfig, got {type(lc)}")
    lc.check(cfg)
    cfg.check_runnable()
    ic.check_noise(noise, cfg)
    state = simulation.initial_conditions(noise, cosmo, cfg)
    states, maps, needs = _record(state, cosmo, cfg, lc)
    parallel_migrate.check_later(needs, cfg)
    return _named(maps, lc), states


def _named(maps, lc):
    """The maps by name and shape (see :func:`lightcone`) from the recorder's rows."""
    out = {}
    for kind, m in maps.items():
        shape = (lc.flat_pixels, lc.flat_pixels) if kind == "flat" else m.shape[1:]
        out[kind] = m[1:].reshape(lc.n_sources, *shape)
        out[kind + "_counts"] = m[0].reshape(shape)
    return out


MAPS = P(("x", "y"))  # one map per device, summed at the end


def _recording_step(state, maps, factors, a_next, shell, tab, cosmo, cfg, lc):
    """:func:`distpm.simulation.step` that also adds the step's crossings to ``maps``.

    factors: (D, K) of the step (see :func:`distpm.simulation.step`)."""
    recorder = record.Recorder(lc, cfg)

    def local(state, maps, factors, a_next, shell, tab, cosmo):
        layout = simulation.mesh_layout(cfg)
        dx = factors[0] * state.vel
        maps = {kind: m[0] for kind, m in maps.items()}  # raw, normalised by _summed
        maps = recorder.add(maps, state.pos, dx, state.mask, shell, tab, cosmo)
        maps = {kind: m[None] for kind, m in maps.items()}
        carry = (state.pos, state.vel, (state.ids,), state.mask, parallel_migrate.no_needs())
        pos, vel, (ids,), mask, needs = integrate.drift_kick(carry, factors, cosmo, layout, cfg)
        a = jnp.asarray(a_next, pos.dtype)
        state = simulation.Particles(pos=pos, vel=vel, ids=ids, mask=mask, a=a)
        return state, maps, layout.device_max(needs)

    specs = (simulation.PARTICLES, MAPS, P(), P(), P(), P(), P())
    out_specs = (simulation.PARTICLES, MAPS, P())
    return simulation.sharded(local, cfg, specs, out_specs)(
        state, maps, factors, a_next, shell, tab, cosmo
    )


recording_step = jax.jit(
    _recording_step, static_argnames=("cfg", "lc"), donate_argnames=("state", "maps")
)


@functools.partial(jax.jit, static_argnames=("cfg", "lc"))
def _zero_maps(cfg, lc):
    recorder = record.Recorder(lc, cfg)

    def local():
        return {kind: m[None] for kind, m in recorder.empty_maps(cfg.float_dtype).items()}

    return simulation.sharded(local, cfg, (), MAPS)()


@functools.partial(jax.jit, static_argnames=("cfg", "lc"))
def _summed(maps, cfg, lc):
    """The devices' raw maps summed and normalised."""

    def local(maps):
        layout = simulation.mesh_layout(cfg)
        summed = {kind: layout.device_sum(m[0]) for kind, m in maps.items()}
        return record.Recorder(lc, cfg).normalise(summed)

    return simulation.sharded(local, cfg, (MAPS,), P())(maps)


class Recording:
    """The lightcone of a run that is stepped one step at a time (``distpm run``).

    :meth:`step` replaces :func:`distpm.simulation.step_in_place` for step i
    of ``cfg.time_grid`` (the state is donated) and returns (state, needs);
    :meth:`maps` gives the maps recorded so far, summed over devices, named
    as :func:`lightcone` names them.
    """

    def __init__(self, cosmo, cfg, lc: LightconeConfig):
        lc.check(cfg)
        self.cfg, self.lc = cfg, lc
        self.shells, self.tables = jax.jit(record.tables, static_argnums=(1, 2))(cosmo, cfg, lc)
        self._maps = _zero_maps(cfg, lc)

    def step(self, state, i, factors, a_next, cosmo):
        args = (state, self._maps, factors, a_next, self.shells[i], self.tables, cosmo)
        state, self._maps, needs = recording_step(*args, cfg=self.cfg, lc=self.lc)
        return state, needs

    def lower(self, state, factors, a_next, cosmo):
        """The recording step, lowered at its first step (memory analysis, AOT compile)."""
        args = (state, self._maps, factors, a_next, self.shells[0], self.tables, cosmo)
        return recording_step.lower(*args, cfg=self.cfg, lc=self.lc)

    def maps(self) -> dict:
        return _named(_summed(self._maps, self.cfg, self.lc), self.lc)
