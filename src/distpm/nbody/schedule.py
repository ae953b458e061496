"""The time steps of a run: grid, kick and drift factors, merged kicks, sync points.

FastPM (Feng et al. 2016) replaces the integrals of 1/(a^3 E) and 1/(a^2 E)
over a step by growth-based factors that make the Zel'dovich (linear)
motion exact:

    drift a0 -> a1, momentum at ac:  dx = p(ac) [D1(a1) - D1(a0)] / Gp(ac)
    kick  a0 -> a1, force at af:     dp = F(af) [Gp(a1) - Gp(a0)] / Gf(af)

with Gp(a) = a^2 E(a) f1(a) D1(a) (so that p = Gp s in linear theory) and
Gf(a) = a^2 E(a) dGp/da = 1.5 Omega_m D1(a). A step i from a_i to a_{i+1}
kicks to the midpoint ac (K1), drifts to a_{i+1} (D), recomputes the force
and kicks to a_{i+1} (K2). The midpoint is the arithmetic (linear_a) or
geometric (log_a) mean.

The kick that ends step i and the one that starts step i + 1 use the same
force, so they are merged: between steps the particles carry positions and
momenta kicked ahead to the next midpoint, no force. The state is
synchronised (momenta at the positions' time) at the start, where K1 is
applied with a first force, and at every stop (each output time and the
end), where a step kicks by K2 alone.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from distpm import background


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Schedule:
    """Steps ``first``, ..., ``first + n_steps - 1`` of a run, with their factors.

    factors: (n_steps, 3) columns (K1, D, K2) (see the module docstring);
    a: the n_steps + 1 scale factors of the step boundaries (host floats);
    stops: indices into ``a`` where the state is synchronised, the last one
    ``n_steps``. A pytree: ``factors`` is its one array, differentiable in
    the cosmology it was made with.
    """

    factors: jax.Array
    a: tuple = dataclasses.field(metadata={"static": True})
    stops: tuple = dataclasses.field(metadata={"static": True})
    first: int = dataclasses.field(default=0, metadata={"static": True})

    @classmethod
    def of(cls, cosmo, cfg) -> Schedule:
        """The steps of ``cfg.time_grid`` (snapshots inserted), stopping at each output."""
        a = np.asarray(cfg.time_grid, dtype=float)
        a0, a1 = a[:-1], a[1:]
        ac = np.sqrt(a0 * a1) if cfg.time_stepping == "log_a" else 0.5 * (a0 + a1)
        table = background.growth_table(cosmo)

        def gp_gf(a):
            d1, f1, _, _ = background.growth(a, table)
            return a**2 * background.E(a, cosmo) * f1 * d1, 1.5 * cosmo.Omega_m * d1, d1

        gp0, gf0, d0 = gp_gf(a0)
        gpc, _, _ = gp_gf(ac)
        gp1, gf1, d1 = gp_gf(a1)
        factors = jnp.stack([(gpc - gp0) / gf0, (d1 - d0) / gpc, (gp1 - gpc) / gf1], axis=-1)
        return cls(factors.astype(cfg.float_dtype), tuple(a.tolist()), cls.stops_of(cfg))

    @staticmethod
    def stops_of(cfg) -> tuple:
        """Indices into ``cfg.time_grid`` of its outputs (snapshots and a_stop)."""
        a = cfg.time_grid
        return tuple(sorted({int(np.argmin(np.abs(a - t))) for t in (*cfg.snapshots, cfg.a_stop)}))

    @property
    def n_steps(self) -> int:
        return len(self.a) - 1

    def segments(self) -> list[Schedule]:
        """The schedules between consecutive stops, each ending synchronised."""
        starts = [0, *self.stops[:-1]]
        return [self.part(start, stop) for start, stop in zip(starts, self.stops, strict=True)]

    def part(self, start: int, stop: int) -> Schedule:
        """Steps ``start`` to ``stop - 1`` (indices into this schedule), ending at a stop."""
        if stop not in self.stops:
            raise ValueError(f"a part must end at a stop {self.stops}, not at step {stop}")
        return Schedule(
            self.factors[start:stop], self.a[start : stop + 1], (stop - start,), self.first + start
        )

    def synchronised_after(self, i: int) -> bool:
        """Whether step ``i`` (index into this schedule) ends with synchronised momenta."""
        return i + 1 in self.stops

    def kicks(self):
        """(n_steps, 2) columns (D, K) of the steps with merged kicks: K = K2 + the next
        step's K1, or K2 alone where the step ends at a stop."""
        k1_next = jnp.concatenate([self.factors[1:, 0], jnp.zeros_like(self.factors[:1, 0])])
        ends = np.isin(np.arange(1, self.n_steps + 1), self.stops)
        k1_next = jnp.where(ends, jnp.zeros_like(k1_next), k1_next)
        return jnp.stack([self.factors[:, 1], self.factors[:, 2] + k1_next], axis=-1)
