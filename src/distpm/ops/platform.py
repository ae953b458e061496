"""The one place where code is chosen by the platform a program is compiled for.

XLA's CPU and GPU backends want different code for some local operations
(a scan over blocks against one wide scatter; a tree of slices against a
library prefix sum). :func:`by_platform` stages out both and keeps the one
for the platform that the program is lowered for (``lax.platform_dependent``):
the choice follows where the data lives, not a global setting, and the
other form is never compiled. Each ``*_cpu`` / ``*_gpu`` pair is public so that
the tests can run the GPU form on the CPU and compare.
"""

from __future__ import annotations

import jax
from jax import lax


def by_platform(*args, cpu, gpu):
    """``cpu(*args)`` in a program compiled for the CPU, ``gpu(*args)`` for any other
    (CUDA, ROCm): both must return arrays of the same shapes, dtypes and sharding.

    Each form runs in a name scope (``by_platform_cpu/NAME``, ``by_platform_gpu/NAME``)
    that stays in the compiled program's metadata: a test reads which one was kept.
    """
    return lax.platform_dependent(*args, cpu=_scoped(cpu, "cpu"), default=_scoped(gpu, "gpu"))


def _scoped(fn, platform):
    name = getattr(fn, "__name__", None) or fn.func.__name__  # a function or a partial of one

    def scoped(*args):
        with jax.named_scope(f"by_platform_{platform}/{name}"):
            return fn(*args)

    return scoped


# Matrix products of float32 that feed physics: on a GPU, XLA's default precision may run them
# in TF32 (10-bit mantissa); this asks for full float32 on every platform.
HIGHEST = lax.Precision.HIGHEST
