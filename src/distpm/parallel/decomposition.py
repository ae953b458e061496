"""How a run is split over its devices, in one place.

The device grid (px, py) with axis names ("x", "y"); fields of the mesh
and of the Lagrangian particle grid split as pencils along z (``FIELD``);
particle buffers and per-device values as one block per device
(``SLOTS``); and the ``shard_map`` wrapper that runs a function on every
device's local block. Everything that runs distributed gets its layouts
and its wrapper from :meth:`Decomposition.of` its config.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
from jax.sharding import PartitionSpec as P

from distpm.parallel.devices import device_mesh
from distpm.parallel.layout import Layout

FIELD = P("x", "y")  # fields: pencils along z
SLOTS = P(("x", "y"))  # particle buffers, per-device values: one block of rows per device


@dataclasses.dataclass(frozen=True)
class Decomposition:
    """The device grid of a run, the layouts of its two grids, its particle buffers.

    grid: (px, py) devices; mesh_shape: the PM mesh; particle_shape: the
    Lagrangian particle grid (white noise, LPT); capacity: particle slots
    per device; exchange_size, neighbour_size: slots per destination of the
    migration's full and neighbours-first exchanges (see
    :mod:`distpm.parallel.migrate`).
    """

    grid: tuple[int, int]
    mesh_shape: tuple[int, int, int]
    particle_shape: tuple[int, int, int]
    capacity: int
    exchange_size: int
    neighbour_size: int | None

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def of(cfg) -> Decomposition:
        """The decomposition of ``cfg``: its device grid, grids and buffer sizes."""
        return Decomposition(
            cfg.device_grid, cfg.mesh_shape, cfg.particle_shape, cfg.capacity,
            cfg.exchange_size, cfg.neighbour_size,
        )  # fmt: skip

    @property
    def n_devices(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def mesh(self) -> Layout:
        """The layout of the PM mesh."""
        return Layout(self.mesh_shape, self.grid)

    @property
    def lattice(self) -> Layout:
        """The layout of the Lagrangian particle grid."""
        return Layout(self.particle_shape, self.grid)

    def sharded(self, fn, in_specs, out_specs):
        """``fn`` on local blocks, run on every device of the grid."""
        return jax.shard_map(
            fn, mesh=device_mesh(self.grid), in_specs=in_specs, out_specs=out_specs
        )
