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

``integrator = "2lpt"`` steps drift-kick-drift in the growth factor D
instead, with coefficients that keep particles exactly on the 2LPT
trajectory x = q + D1 s1 + D2 s2 (positions at every step boundary): the
principle of BullFrog (Rampf, List & Hahn 2025), with the coefficients
derived here for canonical momenta. With v = dx/dD1 = p / Gp, a step from
D_i to D_{i+1} (width h) drifts h/2 with v_i, kicks at the midpoint
D_m = D_i + h/2,

    v_{i+1} = alpha v_i + (1 - alpha) F(x_m) / (Gf0 D_m),    Gf0 = 1.5 Omega_m,

and drifts h/2 with v_{i+1}. As F / (Gf0 D1) = s1 in linear theory, the s1
part of v stays 1 for any alpha (linear growth exact); alpha is fixed so
that the s2 part of the position lands on D2(a_{i+1}). To second order the
force on particles at q + A s1 + B s2 is Gf0 (A s1 + (B - A^2) s2), so with
w_i the s2 part of v_i (dD2/dD1 at the start, then followed step by step),
w_{i+1} = 2 (D2_{i+1} - D2_i) / h - w_i and, with z = (D2_i + w_i h/2 - D_m^2) / D_m,
alpha = (w_{i+1} - z) / (w_i - z). In canonical momenta the kick scales p by
S = alpha Gp_{i+1} / Gp_i and adds K F with K = (1 - alpha) Gp_{i+1} / (Gf0 D_m).
The forces come at the midpoints, so a step costs one force and a run needs
no first one; the half drifts that meet between steps are merged, and the
state is synchronised at each stop by the last half drift.

Both integrators are written as steps of five factors (K1, D1, S, K2, D2):
kick K1, drift D1, scale the momenta by S and kick K2, drift D2. FastPM has
S = 1 and D2 = 0, the 2LPT integrator K1 = 0.
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

    factors: (n_steps, 5) columns (K1, D1, S, K2, D2) (see the module docstring;
    S is dimensionless); a: the n_steps + 1 scale factors of the step boundaries
    (host floats); stops: indices into ``a`` where the state is synchronised,
    the last one ``n_steps``; integrator: "fastpm" or "2lpt". A pytree:
    ``factors`` is its one array, differentiable in the cosmology it was made with.
    """

    factors: jax.Array
    a: tuple = dataclasses.field(metadata={"static": True})
    stops: tuple = dataclasses.field(metadata={"static": True})
    first: int = dataclasses.field(default=0, metadata={"static": True})
    integrator: str = dataclasses.field(default="fastpm", metadata={"static": True})

    @classmethod
    def of(cls, cosmo, cfg) -> Schedule:
        """The steps of ``cfg.time_grid`` (snapshots inserted), stopping at each output."""
        a = np.asarray(cfg.time_grid, dtype=float)
        stops = cls.stops_of(cfg)
        if cfg.integrator == "2lpt":
            factors = _second_order_factors(a, cosmo).astype(cfg.float_dtype)
            return cls(factors, tuple(a.tolist()), stops, integrator="2lpt")
        a0, a1 = a[:-1], a[1:]
        ac = np.sqrt(a0 * a1) if cfg.time_stepping == "log_a" else 0.5 * (a0 + a1)
        table = background.growth_table(cosmo)

        def gp_gf(a):
            d1, f1, _, _ = background.growth(a, table)
            return a**2 * background.E(a, cosmo) * f1 * d1, 1.5 * cosmo.Omega_m * d1, d1

        gp0, gf0, d0 = gp_gf(a0)
        gpc, _, _ = gp_gf(ac)
        gp1, gf1, d1 = gp_gf(a1)
        one, zero = jnp.ones_like(gp0), jnp.zeros_like(gp0)
        factors = [(gpc - gp0) / gf0, (d1 - d0) / gpc, one, (gp1 - gpc) / gf1, zero]
        return cls(jnp.stack(factors, axis=-1).astype(cfg.float_dtype), tuple(a.tolist()), stops)

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
            self.factors[start:stop],
            self.a[start : stop + 1],
            (stop - start,),
            self.first + start,
            self.integrator,
        )

    def synchronised_after(self, i: int) -> bool:
        """Whether step ``i`` (index into this schedule) ends with synchronised momenta."""
        return i + 1 in self.stops

    @property
    def kicks_first(self) -> bool:
        """Whether a synchronised state takes the step's K1 (with a force) before the step."""
        return self.integrator == "fastpm"

    def kicks(self):
        """(n_steps, 4) columns (D, K, S, B) of the merged steps: drift by D, then scale the
        momenta by S and kick by K. D = D1 + the previous step's D2 and K = K2 + the next
        step's K1, merged between steps but not across a stop, where the state is
        synchronised: K1 comes before the step that starts there (:attr:`kicks_first`),
        D2 after the one that ends there (:meth:`closing_drift`). B is the part of D
        before the step's start (the previous step's D2; 0 for FastPM and after a stop):
        the observers see a drift of the 2LPT integrator in two pieces (:func:`drift_knots`).
        """
        f = self.factors
        zero = jnp.zeros_like(f[:1, 0])
        ends = np.isin(np.arange(1, self.n_steps + 1), self.stops)
        k1_next = jnp.where(ends, 0.0, jnp.concatenate([f[1:, 0], zero]))
        d2_prev = jnp.where(np.r_[True, ends[:-1]], 0.0, jnp.concatenate([zero, f[:-1, 4]]))
        return jnp.stack([f[:, 1] + d2_prev, f[:, 3] + k1_next, f[:, 2], d2_prev], axis=-1)

    def closing_drift(self, i: int):
        """The drift D2 that synchronises the state after step ``i`` when it ends at a stop
        (zero for FastPM, whose steps end with positions and momenta at one time)."""
        return self.factors[i, 4]


PIECES = {"fastpm": 1, "2lpt": 2}  # pieces of drift the observers see per step


def drift_knots(cosmo, cfg):
    """(n_steps * PIECES + 1,) the scale factors that bound the pieces of drift the
    observers see (:mod:`distpm.nbody.observer`), differentiable in ``cosmo``.

    FastPM drifts from one step boundary a_i to the next. The 2LPT integrator drifts
    from one step's midpoint in D to the next one's, across the boundary between them:
    its observers see step i in two pieces, [a_i, a_m] and [a_m, a_(i+1)], with
    D(a_m) = (D(a_i) + D(a_(i+1))) / 2, along each of which the particles move linearly in D.
    """
    grid = jnp.asarray(cfg.time_grid, cfg.float_dtype)
    if cfg.integrator == "fastpm":
        return grid
    table = background.growth_table(cosmo)
    d = background.growth(grid, table)[0]
    target = 0.5 * (d[:-1] + d[1:])
    ln_a = 0.5 * jnp.log(grid[:-1] * grid[1:])
    for _ in range(4):  # Newton on ln a (dD/dln a = f D): D is smooth, 4 reach round-off
        d_m, f_m, _, _ = background.growth(jnp.exp(ln_a), table)
        ln_a = ln_a - (d_m - target) / (f_m * d_m)
    pairs = jnp.stack([grid[:-1], jnp.exp(ln_a).astype(grid.dtype)], axis=-1)
    return jnp.concatenate([pairs.reshape(-1), grid[-1:]])


def _second_order_factors(a, cosmo):
    """(n_steps, 5) factors (0, D1, S, K, D2) of the 2LPT integrator (module doc) at the
    step boundaries ``a`` (host floats), differentiable in ``cosmo``."""
    table = background.growth_table(cosmo)
    d1, f1, d2, f2 = background.growth(a, table)
    gp = a**2 * background.E(a, cosmo) * f1 * d1  # p = Gp v
    gf0 = 1.5 * cosmo.Omega_m

    def step(w, xs):
        """w: the s2 part of v = dx/dD1 at the step's start; returns the next one."""
        d_0, d_1, d2_0, d2_1, gp_0, gp_1 = xs
        h = d_1 - d_0
        mid = d_0 + 0.5 * h
        w_next = 2.0 * (d2_1 - d2_0) / h - w
        z = (d2_0 + 0.5 * h * w - mid * mid) / mid
        alpha = (w_next - z) / (w - z)
        scale, kick = alpha * gp_1 / gp_0, (1.0 - alpha) * gp_1 / (gf0 * mid)
        return w_next, jnp.stack([jnp.zeros_like(h), 0.5 * h / gp_0, scale, kick, 0.5 * h / gp_1])

    w0 = f2[0] * d2[0] / (f1[0] * d1[0])  # dD2/dD1 at the start: 2LPT momenta
    xs = (d1[:-1], d1[1:], d2[:-1], d2[1:], gp[:-1], gp[1:])
    _, factors = jax.lax.scan(step, w0, xs)
    return factors
