"""Static simulation configuration: a frozen, hashable, validated dataclass.

A ``SimConfig`` holds everything that fixes array shapes and code paths (mesh,
particle grid, time steps, options). It is validated once, when it is made,
and is passed to jitted functions as a static argument. Cosmological
parameters are *not* here: they are a differentiable pytree
(:class:`distpm.Cosmology`).

Units: lengths in Mpc/h, time variable the scale factor a.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from pathlib import Path
from typing import Any

import jax
import numpy as np

from distpm.linear_power import KINDS as _POWER_KINDS
from distpm.parallel.devices import check_grid, default_grid, parse_devices

PAINT_ORDERS = {"cic": 2, "tsc": 3}  # kernel support in cells
FORCE_GRADIENTS = ("auto", "fd", "ik")
TIME_STEPPINGS = ("linear_a", "log_a")
INTEGRATORS = ("fastpm", "2lpt")
ADJOINTS = ("reverse", "checkpoint")
DTYPES = ("float32", "float64")
POWER_KINDS = tuple(k for k in _POWER_KINDS if k != "table")
INT32_LIMIT = 2**31  # per-device counts index int32 arrays (jax's default 32-bit mode)


def _triple(value, name: str, kind: type) -> tuple:
    """Turn a scalar or a length-3 sequence into a 3-tuple of ``kind``."""
    if isinstance(value, list | tuple):
        if len(value) != 3:
            raise ValueError(f"{name} must be a number or 3 numbers, got {value!r}")
        items = tuple(value)
    else:
        items = (value,) * 3
    try:
        out = tuple(kind(v) for v in items)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must hold {kind.__name__}s, got {value!r}") from None
    if kind is int and any(float(v) != int(v) for v in items):
        raise TypeError(f"{name} must hold whole numbers, got {value!r}")
    return out


@dataclasses.dataclass(frozen=True)
class SimConfig:
    """Configuration of a PM simulation (static: fixes shapes and code paths).

    box_size: [Mpc/h] side of the periodic box; one number or three.
    mesh_shape: cells of the PM mesh per axis; one number or three.
    particle_shape: particles per axis on the Lagrangian grid (default: the
        mesh). The mesh may be finer than the particle grid, never coarser.
    a_start, a_stop: scale factors of the initial conditions and of the end.
    n_steps: number of kick-drift-kick steps from a_start to a_stop.
    time_stepping: "linear_a" (equal steps in a) or "log_a" (equal in ln a).
    integrator: "fastpm" (default: kicks and drifts exact for linear growth) or "2lpt"
        (exact for second-order growth: more accurate in few steps); see
        :mod:`distpm.nbody.schedule`.
    snapshots: scale factors (a_start < a < a_stop) at which
        :func:`distpm.simulate_snapshots` also returns the state; they are
        inserted into the time grid (one equal to a_stop is the final state).
    lpt_order: 1 (Zel'dovich), 2 (2LPT) or 3 (3LPT) initial conditions.
    paint: mass assignment kernel, "cic" or "tsc".
    force_gradient: "fd" (4th-order finite difference), "ik" (spectral) or
        "auto" (default): "fd" with CIC, "ik" with TSC (see
        :attr:`gradient_kind` and :mod:`distpm.gravity` for why).
    compensate_force: divide the force by the mass-assignment window twice
        (once for paint, once for readout); true, false or "auto"
        (default): compensate only when the mesh is less than twice as
        fine as the particle grid (see :attr:`force_compensated` and
        :mod:`distpm.gravity` for the measurements behind this).
    linear_power: "eisenstein_hu", "eisenstein_hu_nowiggle", "camb" (CAMB's
        linear spectrum for the cosmology, with the camb package installed:
        :mod:`distpm.boltzmann`) or the path of a two-column text file
        (k [h/Mpc], P [(Mpc/h)^3] at a=1); CAMB's and a file's are
        renormalised to the cosmology's sigma8.
    fixed_amplitude: if true, initial modes have |delta_k|^2 = P(k) exactly
        (random phases only): removes cosmic variance from tests.
    adjoint: gradient strategy of the N-body loop: "reverse" (integrate back
        in time, memory independent of n_steps) or "checkpoint"
        (``jax.checkpoint`` per step; memory grows with n_steps).
    dtype: "float32" (default) or "float64". float64 needs jax's x64 mode,
        which distpm never switches on by itself on import.
    seed: seed of the white noise ``distpm run`` draws (:func:`distpm.white_noise` with
        seed None); the Python API takes the seed, or a PRNG key, explicitly.
    devices: device grid (px, py) or "PXxPY" over which fields are split as
        pencils along z (see :mod:`distpm.parallel`); None (default) uses
        every visible device in the squarest grid that divides the shapes.
    capacity_factor: each device's particle buffer holds
        ceil(capacity_factor * N / (px py)) slots (at most N). Particles
        cluster as they evolve, so a device may need more than its mean
        share; a run that needs more stops with an error naming this option.
    exchange_factor: when particles migrate, each device reserves
        ceil(exchange_factor * N / (px py)) slots for the particles it sends
        to each other device of a row (then of a column) of the grid
        (a step sends them in r = max(4, p) rounds of 1/r of that, p the
        devices along the axis, so its buffers are r times smaller). The
        default 0.1 is 2x the largest
        need measured (5.5%, 32^3 in
        64 Mpc/h on 8x1 devices, pencils 4 cells wide); raise it if a run
        reports an exchange overflow (large steps on narrow pencils); 1
        always suffices.
    neighbour_factor: the step's migration first sends the particles that
        leave to the next and previous device of a row (then of a column)
        only, in buffers of ceil(neighbour_factor * N / (px py)) slots
        (at most the exchange's); if any particle goes further, or more
        leave towards one neighbour, that stage takes the full exchange
        above (same result, more bytes). 0 always takes the full exchange.
    """

    box_size: tuple[float, float, float] = (256.0, 256.0, 256.0)
    mesh_shape: tuple[int, int, int] = (64, 64, 64)
    particle_shape: tuple[int, int, int] | None = None
    a_start: float = 0.1
    a_stop: float = 1.0
    n_steps: int = 10
    time_stepping: str = "linear_a"
    integrator: str = "fastpm"
    snapshots: tuple[float, ...] = ()
    lpt_order: int = 2
    paint: str = "cic"
    force_gradient: str = "auto"
    compensate_force: bool | str = "auto"
    linear_power: str = "eisenstein_hu"
    fixed_amplitude: bool = False
    adjoint: str = "reverse"
    dtype: str = "float32"
    seed: int = 0
    devices: tuple[int, int] | str | None = None
    capacity_factor: float = 1.5
    exchange_factor: float = 0.1
    neighbour_factor: float = 0.02

    def __post_init__(self):
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731
        put("box_size", _triple(self.box_size, "box_size", float))
        put("mesh_shape", _triple(self.mesh_shape, "mesh_shape", int))
        ptcl = self.mesh_shape if self.particle_shape is None else self.particle_shape
        put("particle_shape", _triple(ptcl, "particle_shape", int))
        for name in ("a_start", "a_stop"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Real):
                raise TypeError(f"{name} must be a number, got {value!r}")
            put(name, float(value))
        # a snapshot at a_stop is the final state itself
        snaps = sorted({float(a) for a in self.snapshots} - {self.a_stop})
        put("snapshots", tuple(snaps))
        put("devices", parse_devices(self.devices))
        self._validate()

    def _validate(self):
        for name in ("n_steps", "lpt_order", "seed"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, numbers.Integral):
                raise TypeError(f"{name} must be an integer, got {value!r}")
        if not isinstance(self.fixed_amplitude, bool):
            raise TypeError(f"fixed_amplitude must be true or false, got {self.fixed_amplitude!r}")
        if not (isinstance(self.compensate_force, bool) or self.compensate_force == "auto"):
            raise TypeError(
                f'compensate_force must be true, false or "auto", got {self.compensate_force!r}'
            )
        pairs = zip(self.snapshots, self.snapshots[1:], strict=False)
        close = [(a, b) for a, b in pairs if b - a < 1e-4]
        if close:
            raise ValueError(f"snapshots {close} are closer than 1e-4 in a; merge them")
        if not all(math.isfinite(b) and b > 0 for b in self.box_size):
            raise ValueError(f"box_size must be positive [Mpc/h], got {self.box_size}")
        if min(self.mesh_shape) < 2:
            raise ValueError(
                f"mesh_shape must have at least 2 cells per axis, got {self.mesh_shape}"
            )
        if min(self.particle_shape) < 1:
            raise ValueError(f"particle_shape must be positive, got {self.particle_shape}")
        coarse = [i for i in range(3) if self.mesh_shape[i] < self.particle_shape[i]]
        if coarse:
            raise ValueError(
                f"mesh_shape {self.mesh_shape} is coarser than particle_shape "
                f"{self.particle_shape} along axis {coarse}: the mesh must have at least as "
                "many cells as particles per axis (use a finer mesh or fewer particles)"
            )
        if not 0.0 < self.a_start < self.a_stop:
            raise ValueError(
                f"need 0 < a_start < a_stop, got a_start={self.a_start}, a_stop={self.a_stop}"
            )
        if self.a_start < 1e-3 or self.a_stop > 2.0:
            raise ValueError(
                f"scale factors must lie in [1e-3, 2], got a_start={self.a_start}, "
                f"a_stop={self.a_stop}"
            )
        if self.n_steps < 1:
            raise ValueError(f"n_steps must be a positive integer, got {self.n_steps!r}")
        bad = [a for a in self.snapshots if not self.a_start < a <= self.a_stop]
        if bad:
            raise ValueError(
                f"snapshots {bad} lie outside (a_start, a_stop] = ({self.a_start}, {self.a_stop}]"
            )
        if self.lpt_order not in (1, 2, 3):
            raise ValueError(f"lpt_order must be 1, 2 or 3, got {self.lpt_order!r}")
        if self.integrator == "2lpt" and self.lpt_order == 1:
            raise ValueError("integrator '2lpt' starts from 2LPT momenta: use lpt_order = 2 or 3")
        for name, allowed in (
            ("paint", tuple(PAINT_ORDERS)),
            ("force_gradient", FORCE_GRADIENTS),
            ("time_stepping", TIME_STEPPINGS),
            ("integrator", INTEGRATORS),
            ("adjoint", ADJOINTS),
            ("dtype", DTYPES),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {getattr(self, name)!r}")
        if self.linear_power not in POWER_KINDS and not Path(self.linear_power).is_file():
            raise ValueError(
                f"linear_power must be one of {POWER_KINDS} or an existing file, "
                f"got {self.linear_power!r}"
            )
        if self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")
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
        _, ny, nz = self.particle_shape
        if ny * nz >= INT32_LIMIT:
            raise ValueError(
                f"particle_shape {self.particle_shape}: a plane of Ny x Nz = {ny * nz} particles "
                f"reaches 2^31, the limit of the id word j * Nz + l; put the longest axis first"
            )
        if self.devices is not None:
            check_grid(self.devices, self.mesh_shape, self.particle_shape, self.paint_order - 1)
            self._check_device_counts()

    def _check_device_counts(self):
        """Raise if a device's slots or mesh cells reach 2^31 (int32 indices) on its grid."""
        px, py = self.device_grid
        # the particle buffer, or the receive buffer of a full exchange (arrivals are
        # scattered into the buffer in place: the two are indexed apart)
        slots = max(self.capacity, max(px, py) * self.exchange_size)
        nx, ny, nz = self.mesh_shape
        halo = 2 * (self.paint_order - 1)
        cells = (nx // px + halo) * (ny // py + halo) * (nz + halo)
        if slots >= INT32_LIMIT or cells >= INT32_LIMIT:
            raise ValueError(
                f"a device would hold {slots} particle slots and {cells} mesh cells on the "
                f"grid {px}x{py}; each must stay below 2^31 (int32 indices): use more devices"
            )

    # ---- derived quantities -------------------------------------------------

    @property
    def cell_size(self) -> tuple[float, float, float]:
        """[Mpc/h] mesh cell size per axis."""
        return tuple(b / n for b, n in zip(self.box_size, self.mesh_shape, strict=True))

    @property
    def n_particles(self) -> int:
        return math.prod(self.particle_shape)

    @property
    def device_grid(self) -> tuple[int, int]:
        """(px, py): ``devices``, or all visible devices in the squarest valid grid."""
        if self.devices is not None:
            return self.devices
        return default_grid(self.mesh_shape, self.particle_shape, self.paint_order - 1)

    @property
    def n_devices(self) -> int:
        px, py = self.device_grid
        return px * py

    @property
    def capacity(self) -> int:
        """Particle slots per device (see ``capacity_factor``)."""
        if self.n_devices == 1:
            return self.n_particles
        return min(
            self.n_particles, math.ceil(self.capacity_factor * self.n_particles / self.n_devices)
        )

    @property
    def exchange_size(self) -> int:
        """Slots per destination device in one migration stage (see ``exchange_factor``)."""
        return min(
            self.capacity, math.ceil(self.exchange_factor * self.n_particles / self.n_devices)
        )

    @property
    def neighbour_size(self) -> int | None:
        """Slots per neighbour of the step's first exchange (see ``neighbour_factor``);
        None when it is off."""
        if self.neighbour_factor == 0:
            return None
        size = math.ceil(self.neighbour_factor * self.n_particles / self.n_devices)
        return min(self.exchange_size, size)

    @property
    def mesh_ratio(self) -> float:
        """Mesh cells per particle spacing: the smallest of mesh / particle_shape over the axes."""
        return min(m / p for m, p in zip(self.mesh_shape, self.particle_shape, strict=True))

    @property
    def force_compensated(self) -> bool:
        """Whether the force divides out the mass-assignment window (``compensate_force``).

        "auto": when the mesh is less than twice as fine as the particle
        grid (``mesh_ratio < 2``).
        """
        if self.compensate_force == "auto":
            return self.mesh_ratio < 2
        return self.compensate_force

    @property
    def gradient_kind(self) -> str:
        """The force's gradient kernel (``force_gradient``); "auto": "fd" for CIC, "ik" for TSC."""
        if self.force_gradient == "auto":
            return "fd" if self.paint == "cic" else "ik"
        return self.force_gradient

    @property
    def paint_order(self) -> int:
        return PAINT_ORDERS[self.paint]

    @property
    def float_dtype(self):
        return np.dtype(self.dtype)

    @property
    def time_grid(self) -> np.ndarray:
        """Scale factors of the step boundaries, snapshots inserted (float64, host)."""
        if self.time_stepping == "linear_a":
            a = np.linspace(self.a_start, self.a_stop, self.n_steps + 1)
        else:
            a = np.geomspace(self.a_start, self.a_stop, self.n_steps + 1)
        return np.unique(np.concatenate([a, np.asarray(self.snapshots, dtype=float)]))

    def check_runnable(self):
        """Raise if this config cannot run here: float64 without jax's x64 mode, or
        per-device counts past int32 on the (default) device grid."""
        self._check_device_counts()
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise ValueError(
                "dtype='float64' needs jax's x64 mode: run inside `with jax.enable_x64(True):` "
                "or call jax.config.update('jax_enable_x64', True) before using distpm"
            )

    def replace(self, **changes) -> SimConfig:
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SimConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; valid options: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
