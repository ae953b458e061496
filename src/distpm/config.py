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
from typing import Any

import jax
import numpy as np

from distpm.linear_power import NAMED as POWER_KINDS
from distpm.parallel.decomposition import INT32_LIMIT, Decomposition, ParallelOptions

PAINT_ORDERS = {"cic": 2, "tsc": 3}  # kernel support in cells
FORCE_GRADIENTS = ("auto", "fd", "ik")
TIME_STEPPINGS = ("linear_a", "log_a")
INTEGRATORS = ("fastpm", "2lpt")
ADJOINTS = ("reverse", "checkpoint")
DTYPES = ("float32", "float64")


def _triple(value, name: str, kind: type) -> tuple:
    """Turn a scalar or a length-3 sequence into a 3-tuple of ``kind``."""
    if isinstance(value, list | tuple):
        if len(value) != 3:
            raise ValueError(f"{name} must be a number or 3 numbers, got {value!r}")
        items = tuple(value)
    else:
        items = (value,) * 3
    if any(isinstance(v, str | bool) for v in items):  # "256" is text: a run file's typo
        raise TypeError(f'{name} must hold numbers (256, not "256"), got {value!r}')
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
    parallel: how the run is split over devices (the device grid and the
        buffers' factors): :class:`~distpm.parallel.decomposition.ParallelOptions`,
        a dict of them, or a device grid alone ((px, py), "2x2"). They change
        where particles live, not what they do (a resumed run may change
        them); :meth:`on` changes them. The device grid and buffer sizes they
        make on this runtime are :meth:`Decomposition.of
        <distpm.parallel.decomposition.Decomposition.of>` the config.
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
    parallel: ParallelOptions = ParallelOptions()

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
        put("parallel", ParallelOptions.from_value(self.parallel))
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
            raise ValueError(f"n_steps must be a positive integer, got {self.n_steps}")
        bad = [a for a in self.snapshots if not self.a_start < a <= self.a_stop]
        if bad:
            raise ValueError(
                f"snapshots {bad} lie outside (a_start, a_stop] = ({self.a_start}, {self.a_stop}]"
            )
        if self.lpt_order not in (1, 2, 3):
            raise ValueError(f"lpt_order must be 1, 2 or 3, got {self.lpt_order}")
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
        if not isinstance(self.linear_power, str):
            raise TypeError(
                f"linear_power must be one of {POWER_KINDS} or a file name, "
                f"got {self.linear_power!r}"
            )
        if not 0 <= self.seed < 2**63:  # what a PRNG key holds
            raise ValueError(f"seed must be an integer in [0, 2^63), got {self.seed}")
        _, ny, nz = self.particle_shape
        if ny * nz >= INT32_LIMIT:
            raise ValueError(
                f"particle_shape {self.particle_shape}: a plane of Ny x Nz = {ny * nz} particles "
                f"reaches 2^31, the limit of the id word j * Nz + l; put the longest axis first"
            )
        if self.parallel.devices is not None:  # the grid fits, and int32 counts (no device query)
            Decomposition.of(self)

    # ---- derived quantities -------------------------------------------------

    @property
    def cell_size(self) -> tuple[float, float, float]:
        """[Mpc/h] mesh cell size per axis."""
        return tuple(b / n for b, n in zip(self.box_size, self.mesh_shape, strict=True))

    @property
    def n_particles(self) -> int:
        return math.prod(self.particle_shape)

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
        Decomposition.of(self)
        if self.dtype == "float64" and not jax.config.jax_enable_x64:
            raise ValueError(
                "dtype='float64' needs jax's x64 mode: run inside `with jax.enable_x64(True):` "
                "or call jax.config.update('jax_enable_x64', True) before using distpm"
            )

    def replace(self, **changes) -> SimConfig:
        return dataclasses.replace(self, **changes)

    def on(self, devices=..., **options) -> SimConfig:
        """The same run split another way: on ``devices`` ((px, py), "2x2" or None for all
        visible devices), with any other
        :class:`~distpm.parallel.decomposition.ParallelOptions` changed."""
        if devices is not ...:
            options["devices"] = devices
        return self.replace(parallel=self.parallel.replace(**options))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> SimConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown option(s) {unknown}; valid options: {sorted(known)}")
        return cls(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
