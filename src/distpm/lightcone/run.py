"""The lightcone as an observer of the steps: convergence maps recorded on the way.

Every device records the crossings of its own particles into full maps;
the maps are summed over devices (and processes) at the end, never the
particles. Differentiable with respect to the noise and the cosmology
through the reverse-time adjoint (:mod:`distpm.nbody.loop`): the maps'
cotangent enters every step of the backward pass, so memory does not grow
with the number of steps.
"""

from __future__ import annotations

import dataclasses

import jax

from distpm import ic, simulation
from distpm.lightcone import record
from distpm.lightcone.config import LightconeConfig


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class LightconeObserver:
    """The observer's past lightcone (:class:`distpm.nbody.observer.Observer`).

    shells, tables: the differentiable tables of :func:`distpm.lightcone.record.tables`,
    made with the run's cosmology (:meth:`of`). Its record: per map kind,
    this device's raw maps (n_pixels, 1 + n_sources); its result: the maps
    named as :func:`lightcone` returns them.
    """

    shells: jax.Array
    tables: dict
    recorder: record.Recorder = dataclasses.field(metadata={"static": True})
    differentiable = True

    @classmethod
    def of(cls, cosmo, cfg, lc: LightconeConfig) -> LightconeObserver:
        if not isinstance(lc, LightconeConfig):
            raise TypeError(f"lc must be a distpm.lightcone.LightconeConfig, got {type(lc)}")
        lc.check(cfg)
        shells, tables = jax.jit(record.tables, static_argnums=(1, 2))(cosmo, cfg, lc)
        return cls(shells, tables, record.Recorder(lc, cfg))

    def empty(self, dtype):
        return self.recorder.empty_maps(dtype)

    def observe(self, maps, piece, pos, dx, mask, cosmo, layout):
        return self.recorder.add(maps, pos, dx, mask, self.shells[piece], self.tables, cosmo)

    def finish(self, maps, pos, mask, cosmo, layout):
        summed = {kind: layout.device_sum(m) for kind, m in maps.items()}
        return _named(self.recorder.normalise(summed), self.recorder.lc)


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
    observer = LightconeObserver.of(cosmo, cfg, lc)
    cfg.check_runnable()
    ic.check_noise(noise, cfg)
    state = simulation.initial_conditions(noise, cosmo, cfg)
    states, (maps,) = simulation.evolve(state, cosmo, cfg, observers=(observer,))
    return maps, states


def _named(maps, lc):
    """The maps by name and shape (see :func:`lightcone`) from the recorder's rows."""
    out = {}
    for kind, m in maps.items():
        shape = (lc.flat_pixels, lc.flat_pixels) if kind == "flat" else m.shape[1:]
        out[kind] = m[1:].reshape(lc.n_sources, *shape)
        out[kind + "_counts"] = m[0].reshape(shape)
    return out
