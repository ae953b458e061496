"""How a run is split over its devices, in one place.

:class:`ParallelOptions` are what a user chooses (the device grid, the
buffers' factors: what a resumed run may change); a :class:`Decomposition`
is what they make for one configuration on this runtime: the device grid
(px, py) with axis names ("x", "y"); fields of the mesh and of the
Lagrangian particle grid split as pencils along z (``FIELD``); particle
buffers and per-device values as one block per device (``SLOTS``); and the
``shard_map`` wrapper that runs a function on every device's local block.
Everything that runs distributed gets its layouts, sizes and wrapper from
:meth:`Decomposition.of` its config.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from distpm.parallel.devices import (
    check_grid,
    default_grid,
    device_mesh,
    parse_devices,
    visible_devices,
)
from distpm.parallel.layout import Layout

FIELD = P("x", "y")  # fields: pencils along z
SLOTS = P(("x", "y"))  # particle buffers, per-device values: one block of rows per device


INT32_LIMIT = 2**31  # per-device counts index int32 arrays (jax's default 32-bit mode)


@dataclasses.dataclass(frozen=True)
class ParallelOptions:
    """How a run is split over devices (the ``[parallel]`` table of a run file).

    devices: device grid (px, py) or "PXxPY" over which fields are split as
        pencils along z (see :mod:`distpm.parallel`); None (default) uses
        every visible device in the squarest grid that divides the shapes.
    capacity_factor: each device's particle buffer holds
        ceil(capacity_factor * N / (px py)) slots (at most N). Particles
        cluster as they evolve, so a device may need more than its mean
        share; a run that needs more stops with an error naming this option.
    exchange_factor: when particles migrate, each device reserves
        ceil(exchange_factor * N / (px py)) slots for the particles it sends
        to each other device of a row (then of a column) of the grid (a step
        sends them in r = max(4, p) rounds of 1/r of that, p the devices
        along the axis). The default 0.1 is twice the largest need measured
        (32^3 in 64 Mpc/h on 8x1 devices); raise it if a run reports an
        exchange overflow (large steps on narrow pencils); 1 always suffices.
    neighbour_factor: the step's migration first sends the particles that
        leave to the next and previous device of a row (then of a column)
        only, in buffers of ceil(neighbour_factor * N / (px py)) slots (at
        most the exchange's); if any particle goes further, or more leave
        towards one neighbour, that stage takes the full exchange above
        (same result, more bytes). 0 always takes the full exchange.
    """

    devices: tuple[int, int] | str | None = None
    capacity_factor: float = 1.5
    exchange_factor: float = 0.1
    neighbour_factor: float = 0.02

    def __post_init__(self):
        object.__setattr__(self, "devices", parse_devices(self.devices))
        for name in ("capacity_factor", "exchange_factor", "neighbour_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {value!r}")
        if not 1.0 <= self.capacity_factor < math.inf:
            raise ValueError(f"capacity_factor must be >= 1, got {self.capacity_factor!r}")
        if not 0.0 < self.exchange_factor < math.inf:
            raise ValueError(f"exchange_factor must be > 0, got {self.exchange_factor!r}")
        if not 0.0 <= self.neighbour_factor < math.inf:
            raise ValueError(f"neighbour_factor must be >= 0, got {self.neighbour_factor!r}")

    @classmethod
    def from_value(cls, value: Any) -> ParallelOptions:
        """From options, a table of them (dict), or a device grid alone ((px, py), "2x2", None)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            known = {f.name for f in dataclasses.fields(cls)}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(
                    f"unknown parallel option(s) {unknown}; valid: {sorted(known)} (in [parallel])"
                )
            return cls(**value)
        return cls(devices=value)

    def replace(self, **changes) -> ParallelOptions:
        return dataclasses.replace(self, **changes)


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
    def of(cfg) -> Decomposition:
        """The decomposition of a :class:`~distpm.SimConfig` by its ``parallel`` options: the
        device grid (all visible devices where they give none), grids and buffer sizes.

        Raises a ValueError if the grid does not split the shapes, or if a device would
        hold 2^31 particle slots or mesh cells (int32 indices).
        """
        return Decomposition._of(cfg, len(visible_devices()))

    @staticmethod
    @functools.lru_cache(maxsize=64)
    def _of(cfg, n_visible: int) -> Decomposition:
        opts, halo = cfg.parallel, cfg.paint_order - 1
        if opts.devices is None:
            grid = default_grid(cfg.mesh_shape, cfg.particle_shape, halo)
        else:
            grid = opts.devices
            check_grid(grid, cfg.mesh_shape, cfg.particle_shape, halo, n_visible)
        n, p = cfg.n_particles, grid[0] * grid[1]
        capacity = n if p == 1 else min(n, math.ceil(opts.capacity_factor * n / p))
        exchange = min(capacity, math.ceil(opts.exchange_factor * n / p))
        near = None
        if opts.neighbour_factor > 0:
            near = min(exchange, math.ceil(opts.neighbour_factor * n / p))
        out = Decomposition(grid, cfg.mesh_shape, cfg.particle_shape, capacity, exchange, near)
        out._check_counts(halo)
        return out

    def _check_counts(self, halo: int):
        """Raise if a device's slots or mesh cells reach 2^31 (int32 indices)."""
        px, py = self.grid
        # the particle buffer, or the receive buffer of a full exchange (arrivals are
        # scattered into the buffer in place: the two are indexed apart)
        slots = max(self.capacity, max(px, py) * self.exchange_size)
        nx, ny, nz = self.mesh_shape
        cells = (nx // px + 2 * halo) * (ny // py + 2 * halo) * (nz + 2 * halo)
        if slots >= INT32_LIMIT or cells >= INT32_LIMIT:
            raise ValueError(
                f"a device would hold {slots} particle slots and {cells} mesh cells on the "
                f"grid {px}x{py}; each must stay below 2^31 (int32 indices): use more devices"
            )

    @property
    def n_devices(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def slots(self) -> int:
        """Particle slots over all devices (the rows of a run's particle arrays)."""
        return self.n_devices * self.capacity

    @property
    def mesh(self) -> Layout:
        """The layout of the PM mesh."""
        return Layout(self.mesh_shape, self.grid)

    @property
    def lattice(self) -> Layout:
        """The layout of the Lagrangian particle grid."""
        return Layout(self.particle_shape, self.grid)

    def sharding(self, spec=FIELD) -> NamedSharding:
        """The sharding of a global array laid out as ``spec`` (``FIELD``, ``SLOTS``)."""
        return NamedSharding(device_mesh(self.grid), spec)

    def sharded(self, fn, in_specs, out_specs):
        """``fn`` on local blocks, run on every device of the grid."""
        return jax.shard_map(
            fn, mesh=device_mesh(self.grid), in_specs=in_specs, out_specs=out_specs
        )
