"""The device grid (px, py): parsing, validation against a config, and the jax Mesh.

Fields of shape (Nx, Ny, Nz) are split over the grid as pencils: device
(ix, iy) holds x cells [ix Nx/px, (ix+1) Nx/px) and y cells
[iy Ny/py, (iy+1) Ny/py), all of z. The k-space layout of the pencil FFT
also splits the y axis over px devices, so Ny must be divisible by px too.
"""

from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import os

import jax
import numpy as np
from jax.sharding import Mesh

AXES = ("x", "y")


class TooFewDevices(ValueError):
    """A device grid needs more devices than JAX sees."""


def parse_devices(value) -> tuple[int, int] | None:
    """A device grid from ``(px, py)``, ``[px, py]``, ``"2x2"`` or None (automatic)."""
    if value is None:
        return None
    if isinstance(value, str):
        parts = value.lower().split("x")
        try:
            grid = tuple(int(p) for p in parts)
        except ValueError:
            grid = ()
        if len(grid) != 2:
            raise ValueError(f"devices must look like '2x2' (px x py), got {value!r}")
    elif isinstance(value, list | tuple) and len(value) == 2:
        if any(isinstance(v, bool) or int(v) != v for v in value):
            raise TypeError(f"devices must hold two integers, got {value!r}")
        grid = tuple(int(v) for v in value)
    else:
        raise TypeError(f"devices must be (px, py), 'PXxPY' or None, got {value!r}")
    if min(grid) < 1:
        raise ValueError(f"devices must be positive, got {grid}")
    return grid


def grid_problems(grid, mesh_shape, particle_shape, halo: int) -> list[str]:
    """Why ``grid`` cannot split these shapes (empty list: it can).

    halo: cells a painted block reaches into its neighbour (1 for CIC, 2 for
    TSC); each local block must be at least that wide along a split axis.
    """
    px, py = grid
    out = []
    for name, shape in (("mesh_shape", mesh_shape), ("particle_shape", particle_shape)):
        for axis, n, p in ((0, shape[0], px), (1, shape[1], py), (1, shape[1], px)):
            if n % p:
                why = (
                    " (the pencil FFT splits y over px in k-space)" if axis == 1 and p == px else ""
                )
                out.append(
                    f"{name}[{axis}] = {n} is not divisible by {p}: {n} % {p} = {n % p}{why}"
                )
    for axis, p in ((0, px), (1, py)):
        if p > 1 and mesh_shape[axis] % p == 0 and mesh_shape[axis] // p < halo:
            out.append(
                f"mesh_shape[{axis}] / {p} = {mesh_shape[axis] // p} cells per device is "
                f"narrower than the paint halo ({halo})"
            )
    return list(dict.fromkeys(out))


def valid_grids(n_devices: int, mesh_shape, particle_shape, halo: int) -> list[tuple[int, int]]:
    """All grids of exactly ``n_devices`` that split the shapes, squarest first."""
    grids = [(px, n_devices // px) for px in range(1, n_devices + 1) if n_devices % px == 0]
    ok = [g for g in grids if not grid_problems(g, mesh_shape, particle_shape, halo)]
    return sorted(ok, key=lambda g: (abs(math.log(g[0] / g[1])), -g[0]))


def check_grid(grid, mesh_shape, particle_shape, halo: int, available: int | None = None) -> None:
    """Raise a ValueError naming the axis, the numbers and the nearest valid grids (of at
    most ``available`` devices, where it is known)."""
    problems = grid_problems(grid, mesh_shape, particle_shape, halo)
    if not problems:
        return
    n = grid[0] * grid[1]
    most = 2 * n if available is None else available
    nearby = []
    for count in sorted(range(1, most + 1), key=lambda c: (abs(c - n), c)):
        nearby += valid_grids(count, mesh_shape, particle_shape, halo)[:2]
        if len(nearby) >= 4:
            break
    of = "" if available is None else f" (of the {available} here)"
    hint = ", ".join(f"{px}x{py}" for px, py in nearby) or "none"
    raise ValueError(
        f"device grid {grid[0]}x{grid[1]} does not fit: "
        + "; ".join(problems)
        + f". Valid grids near {n} devices{of}: {hint}"
    )


# the devices programs are made for, where they are not this runtime's (compiling_for)
_TARGET: contextvars.ContextVar[tuple | None] = contextvars.ContextVar("target", default=None)


@contextlib.contextmanager
def compiling_for(devices):
    """Make programs, inside the block, for ``devices`` instead of ``jax.devices()``.

    devices: e.g. a deviceless GPU topology's (:mod:`distpm.parallel.targets`): device
    grids, meshes and shardings are made of them, so ``jit(...).lower(...).compile()``
    compiles for them; nothing can run on them.
    """
    # JAX's caches keep traces whose meshes were made of other devices (a jitted function's
    # inner shard_map is traced once per static config): empty them on the way in and out
    jax.clear_caches()
    token = _TARGET.set(tuple(devices))
    try:
        yield
    finally:
        _TARGET.reset(token)
        jax.clear_caches()


def visible_devices() -> list:
    """The devices programs are made for: ``jax.devices()``, or those of :func:`compiling_for`."""
    target = _TARGET.get()
    return list(target) if target is not None else jax.devices()


def platform() -> str:
    """The platform programs are made for ("cpu", "gpu"), as ``jax.default_backend()`` says it."""
    target = _TARGET.get()
    return jax.default_backend() if target is None else target[0].platform


def default_grid(mesh_shape, particle_shape, halo: int) -> tuple[int, int]:
    """All visible devices in the squarest grid that splits the shapes (px >= py)."""
    n = len(visible_devices())
    grids = valid_grids(n, mesh_shape, particle_shape, halo)
    if not grids:
        raise ValueError(
            f"no grid of all {n} devices splits mesh_shape {mesh_shape} and particle_shape "
            f"{particle_shape}; set devices explicitly (e.g. devices='1x1')"
        )
    return grids[0]


def device_mesh(grid: tuple[int, int]) -> Mesh:
    """A jax Mesh of the first px*py devices (:func:`visible_devices`) with axes ("x", "y").

    With several processes every process must own a device of the grid
    (otherwise it would have no part of the work): a ValueError says so.
    """
    return _mesh(tuple(grid), tuple(visible_devices()))


@functools.cache
def _mesh(grid: tuple[int, int], devices: tuple) -> Mesh:
    px, py = grid
    if px * py > len(devices):
        raise TooFewDevices(
            f"device grid {px}x{py} needs {px * py} devices but jax sees {len(devices)} "
            f"({devices[0].platform}); on CPU, start with --cpu-devices {px * py}"
        )
    used = devices[: px * py]
    idle = sorted(set(range(jax.process_count())) - {d.process_index for d in used})
    if idle:
        raise ValueError(
            f"device grid {px}x{py} uses the first {px * py} of {len(devices)} devices, so "
            f"processes {idle} would have none: with {jax.process_count()} processes, use a "
            f"grid of {len(devices)} devices (each process brings {jax.local_device_count()})"
        )
    return Mesh(np.array(used).reshape(px, py), AXES)


# XLA's GPU flags that make every floating-point reduction and scatter-add run in one fixed
# order (XLA's CPU backend does already; it accepts and ignores them)
DETERMINISTIC_FLAGS = (
    "--xla_gpu_deterministic_ops=true",
    "--xla_gpu_enable_scatter_determinism_expander=true",
)
DETERMINISTIC_ENV = "DISTPM_DETERMINISTIC"


def set_deterministic(environ=None) -> None:
    """Make GPU results bitwise repeatable (XLA's determinism flags in ``XLA_FLAGS``).

    On a GPU, XLA's floating-point scatter-adds are atomic and their order
    varies from run to run: mass assignment, P(k) bins, lightcone maps and
    catalogue moments then differ in the last bits between repeats. With
    these flags they are computed in a fixed order, at a cost in speed
    (``benchmarks/gpu/README.md``). XLA reads its flags when it creates its
    backends, so this must run before any JAX computation: the CLI's
    ``--deterministic`` and ``DISTPM_DETERMINISTIC=1`` (read at ``import distpm``)
    call it then. ``environ``: where to write the flags (default: this process's
    environment, refused once JAX's backends have started without them).
    """
    from jax._src import xla_bridge

    started = xla_bridge.backends_are_initialized()
    if environ is None and started and not is_deterministic():
        raise RuntimeError(
            "deterministic mode must be chosen before JAX starts its backends: set "
            f"{DETERMINISTIC_ENV}=1 before starting Python, or call "
            "distpm.parallel.devices.set_deterministic() before any JAX computation"
        )
    environ = os.environ if environ is None else environ
    names = {flag.split("=")[0] for flag in DETERMINISTIC_FLAGS}
    flags = [f for f in environ.get("XLA_FLAGS", "").split() if f.split("=")[0] not in names]
    environ["XLA_FLAGS"] = " ".join([*flags, *DETERMINISTIC_FLAGS])


def is_deterministic(environ=None) -> bool:
    """Whether this process's ``XLA_FLAGS`` ask for deterministic GPU results."""
    environ = os.environ if environ is None else environ
    flags = set(environ.get("XLA_FLAGS", "").split())
    return all(flag in flags for flag in DETERMINISTIC_FLAGS)


def deterministic_asked(environ=None) -> bool:
    """Whether ``DISTPM_DETERMINISTIC`` asks for deterministic mode (1, true, yes, on)."""
    environ = os.environ if environ is None else environ
    value = environ.get(DETERMINISTIC_ENV, "").strip().lower()
    if value in ("", "0", "false", "no", "off"):
        return False
    if value in ("1", "true", "yes", "on"):
        return True
    raise ValueError(f"{DETERMINISTIC_ENV}={value!r}: use 1 (deterministic) or 0")


# XLA's CPU compiler orders a program for concurrency by default: independent operations (the
# gradient's adjoint terms, the initial conditions' transforms) run side by side, each holding
# its buffers. Its memory-minimising order needs a quarter less for a gradient through a run.
CPU_SCHEDULER_FLAG = "--xla_cpu_enable_concurrency_optimized_scheduler"


def cpu_schedule_chosen(environ=None) -> str | None:
    """The value ``XLA_FLAGS`` gives XLA's CPU scheduler flag ("true", "false"), or None."""
    environ = os.environ if environ is None else environ
    chosen = [
        f for f in environ.get("XLA_FLAGS", "").split() if f.split("=")[0] == CPU_SCHEDULER_FLAG
    ]
    return chosen[-1].split("=", 1)[-1] if chosen else None


def prefer_low_memory_cpu_schedule(environ=None) -> bool:
    """Ask XLA's CPU compiler for its memory-minimising schedule (``XLA_FLAGS``), unless
    ``XLA_FLAGS`` already chooses (``--xla_cpu_enable_concurrency_optimized_scheduler=true``
    keeps XLA's concurrent schedule) or JAX's backends have started (XLA reads its flags
    once, when it makes them). ``import distpm`` calls it. Returns whether the flag is set.
    """
    from jax._src import xla_bridge

    environ = os.environ if environ is None else environ
    chosen = cpu_schedule_chosen(environ)
    if chosen is not None:
        return chosen == "false"
    if environ is os.environ and xla_bridge.backends_are_initialized():
        return False
    flags = environ.get("XLA_FLAGS", "").split()
    environ["XLA_FLAGS"] = " ".join([*flags, f"{CPU_SCHEDULER_FLAG}=false"])
    return True


def set_cpu_device_count(n: int) -> None:
    """Ask XLA for ``n`` CPU devices; must run before jax creates its backends."""
    if n < 1:
        raise ValueError(f"--cpu-devices must be positive, got {n}")
    flags = [f for f in os.environ.get("XLA_FLAGS", "").split() if "device_count" not in f]
    flags.append(f"--xla_force_host_platform_device_count={n}")
    os.environ["XLA_FLAGS"] = " ".join(flags)
