"""P(k) every N steps, measured inside the run: an observer of the steps.

``[output] power_every = N`` in a run file; the rows go to ``power_steps.txt``.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from distpm.analysis.power import binned, k_bin_edges, mode_counts
from distpm.gravity import paint_density
from distpm.nbody.schedule import PIECES
from distpm.parallel import Layout
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel.decomposition import Decomposition


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PowerSteps:
    """P(k) (default bins of :func:`distpm.power_spectrum`, window compensated) of the
    positions at steps N, 2N, ... of ``cfg.time_grid`` (its snapshots count as step
    boundaries) and at the end (:class:`distpm.nbody.observer.Observer`).

    Its result: (rows, bins) P [(Mpc/h)^3], rows at the scale factors :attr:`a`.
    """

    cfg: object = dataclasses.field(metadata={"static": True})
    every: int = dataclasses.field(metadata={"static": True})
    differentiable = False

    def __post_init__(self):
        if not (isinstance(self.every, int) and self.every >= 1):
            raise ValueError(f"P(k) is measured every N >= 1 steps, got N = {self.every!r}")

    @property
    def steps(self) -> tuple:
        """Indices into ``cfg.time_grid`` of the rows: multiples of N, and the last."""
        n = len(self.cfg.time_grid) - 1
        return (*range(self.every, n, self.every), n)

    @property
    def a(self) -> np.ndarray:
        return self.cfg.time_grid[list(self.steps)]

    @property
    def edges(self) -> tuple:
        return tuple(k_bin_edges(self.cfg))

    def empty(self, dtype):
        return Layout.varying(jnp.zeros((len(self.steps), len(self.edges) - 1), dtype))

    def _power(self, pos, mask, layout):
        # a copy sent to the owners first: the 2LPT integrator's positions at a step boundary
        # lie half a drift from the owners its particles were sent to (an overflow of the
        # migration's buffers makes the row NaN, never a P(k) with particles left out)
        dec = Decomposition.of(self.cfg)
        (pos,), _, mask, needs = parallel_migrate.by_position(
            [pos], [], mask, 0, layout, self.cfg.cell_size, dec.exchange_size, dec.neighbour_size
        )
        delta = paint_density(pos, mask, layout, self.cfg) - 1.0
        n_modes = np.maximum(mode_counts(self.cfg.mesh_shape, self.cfg.box_size, self.edges)[0], 1)
        power = binned(delta, None, layout, self.cfg, self.edges) / jnp.asarray(n_modes, pos.dtype)
        return parallel_migrate.checked(power, layout.device_max(needs), self.cfg)

    def observe(self, rows, piece, pos, dx, mask, cosmo, layout):
        if len(self.steps) == 1:  # only the end
            return rows
        # the pieces of drift that start at the rows' step boundaries (distpm.nbody.schedule)
        starts = jnp.asarray(self.steps[:-1], jnp.int32) * PIECES[self.cfg.integrator]
        row = jnp.searchsorted(starts, piece)
        hit = jnp.isin(piece, starts)
        measure = lambda rows: rows.at[row].set(self._power(pos, mask, layout))  # noqa: E731
        return jax.lax.cond(hit, measure, lambda rows: rows, rows)

    def finish(self, rows, pos, mask, cosmo, layout):
        rows = layout.device_max(rows)  # the same on every device: one copy, typed so
        return rows.at[-1].set(self._power(pos, mask, layout))

    def table(self, rows):
        """(k [h/Mpc] of the filled bins, a of the rows, P [(Mpc/h)^3] (rows, filled bins))."""
        n_modes, k = mode_counts(self.cfg.mesh_shape, self.cfg.box_size, self.edges)
        filled = n_modes > 0
        return k[filled], self.a, np.asarray(rows)[:, filled]

    def write(self, file, rows):
        """``power_steps.txt`` to ``file`` (a name or an open file): a header with the bins' k,
        then one row per time: a, P(k)."""
        k, a, p = self.table(rows)
        header = "a, then P [(Mpc/h)^3] at k [h/Mpc] = " + " ".join(f"{x:.6e}" for x in k)
        np.savetxt(file, np.column_stack([a, p]), header=header, fmt="%.6e")
