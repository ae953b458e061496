"""GPUs to compile for on a machine without one (XLA's deviceless GPU compilation).

XLA's GPU compiler needs no GPU: given a description of the card (an
``xla.GpuTargetConfigProto`` in text form, kept in ``targets/NAME.txtpb`` with
its source) and a topology of N such devices, ``jit(...).lower(...).compile()``
makes the program a GPU would run, with its memory analysis and its HLO. With
:func:`distpm.parallel.devices.compiling_for` the devices of :func:`devices`,
every device grid, mesh and sharding of distpm is made of them.

What it needs: jax's CUDA plugin without a driver (``pip install ".[gpu]"``, or
only ``jax-cuda12-plugin``, ``jax-cuda12-pjrt`` and ``nvidia-cuda-nvcc-cu12``:
ptxas and libdevice), and ``JAX_SKIP_CUDA_CONSTRAINTS_CHECK=1`` before JAX
starts (the plugin otherwise refuses to load without a CUDA driver):
:func:`prepare_environment` sets it.
"""

from __future__ import annotations

import functools
import os
from importlib import resources

NAMES = ("h100", "h200", "a100")
DEFAULT_MEMORY_FRACTION = 0.75  # JAX's allocator takes this much of a GPU by default
FRACTION_ENV = "XLA_PYTHON_CLIENT_MEM_FRACTION"


class NoGpuCompiler(RuntimeError):
    """JAX's CUDA plugin, which holds XLA's GPU compiler, is not installed."""


def prepare_environment(environ=None) -> None:
    """Let jax's CUDA plugin load without a driver; must run before JAX starts."""
    environ = os.environ if environ is None else environ
    environ.setdefault("JAX_SKIP_CUDA_CONSTRAINTS_CHECK", "1")


def config_text(name: str) -> str:
    """The target config of ``name`` (one of :data:`NAMES`), as XLA reads it."""
    if name not in NAMES:
        raise ValueError(f"unknown GPU target {name!r}; known: {', '.join(NAMES)}")
    return resources.files(__package__).joinpath(f"targets/{name}.txtpb").read_text()


def _field(name: str, key: str) -> str:
    """The value of ``key`` in ``name``'s config (a scalar field on a line of its own)."""
    for line in config_text(name).splitlines():
        if line.strip().startswith(f"{key}:"):
            return line.split(":", 1)[1].strip().strip('"')
    raise KeyError(key)


def memory_bytes(name: str) -> int:
    """[bytes] of memory on one card of ``name``."""
    return int(_field(name, "device_memory_size"))


def description(name: str) -> str:
    """The card's name, e.g. "NVIDIA H100 80GB HBM3"."""
    return _field(name, "device_description_str")


def of_device(device_kind: str) -> str | None:
    """The target that describes a device (``jax.devices()[0].device_kind``), if any."""
    words = device_kind.upper().replace("-", " ").split()
    return next((name for name in NAMES if name.upper() in words), None)


def memory_fraction(environ=None) -> float:
    """The share of a GPU's memory JAX's allocator lets XLA use: ``XLA_PYTHON_CLIENT_MEM_FRACTION``
    where set, else 0.75."""
    environ = os.environ if environ is None else environ
    value = environ.get(FRACTION_ENV, "")
    if not value:
        return DEFAULT_MEMORY_FRACTION
    try:
        fraction = float(value)
    except ValueError:
        fraction = -1.0
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"{FRACTION_ENV}={value!r}: give a fraction in (0, 1], e.g. 0.95")
    return fraction


# XLA's GPU compiler schedules (and rematerialises, recomputing values instead of keeping them)
# to fit the program in the module's device_memory_size less its arguments and outputs. In a
# run, jaxlib sets it to the allocator's limit (XLA_PYTHON_CLIENT_MEM_FRACTION of the card);
# without a device it falls back to this share of the target config's device_memory_size.
COMPILER_DEFAULT_SHARE = 0.8


def budget_bytes(name: str, environ=None) -> float:
    """[bytes] the allocator of a run on one ``name`` card lets XLA use."""
    return memory_bytes(name) * memory_fraction(environ)


@functools.cache
def devices(name: str, count: int, limit: float | None = None) -> tuple:
    """``count`` devices of the GPU ``name``, one host, to compile for (none can run).

    limit: the device memory [bytes] XLA's compiler is to plan for, as a run's allocator
    limit sets it (default: :func:`budget_bytes`), so that the programs compiled here are
    those a run compiles on the card.
    """
    text = config_text(name)
    limit = budget_bytes(name) if limit is None else limit
    planned = int(limit / COMPILER_DEFAULT_SHARE)
    text = text.replace(
        f"device_memory_size: {memory_bytes(name)}", f"device_memory_size: {planned}"
    )
    prepare_environment()
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(
            platform="cuda", target_config=text, topology=f"1x1x{count}"
        )
    except Exception as err:  # jax raises RuntimeError or ValueError for a missing plugin
        raise NoGpuCompiler(
            f"cannot compile for {name}: XLA's GPU compiler did not start ({err}). It comes "
            'with jax\'s CUDA plugin: pip install ".[gpu]" (or jax-cuda12-plugin, '
            "jax-cuda12-pjrt and nvidia-cuda-nvcc-cu12 at jax's version); no GPU is needed"
        ) from err
    return tuple(topo.devices)
