"""Running sums and maxima (inclusive prefix scans) along the first axis.

On the CPU, ``jnp.cumsum`` and ``lax.cummax`` lower to a ``reduce_window``
that XLA's CPU backend runs at 6-16 ns per element, more than a gather,
where ``lax.associative_scan`` (a tree of slices and elementwise ops) runs
the same scan at 1-3 ns per element (2^16-2^21 int32; see
``benchmarks/halos.md``). On a GPU, ``jnp.cumsum`` is one library kernel
(CUB) and ``lax.cummax`` a reduction XLA rewrites into a tree, each one
launch where the slices' tree is 2 log2(n) small ones.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from distpm.ops.platform import by_platform


def _as(x, dtype):
    x = jnp.asarray(x)
    if dtype is None and x.dtype == jnp.bool_:
        dtype = jnp.int32
    return x if dtype is None else x.astype(dtype)


def running_sum_cpu(x):
    """The CPU form of :func:`running_sum` (``lax.associative_scan``)."""
    return lax.associative_scan(jnp.add, x)


def running_sum_gpu(x):
    """The GPU form of :func:`running_sum` (``jnp.cumsum``)."""
    return jnp.cumsum(x, axis=0, dtype=x.dtype)


def running_max_cpu(x):
    """The CPU form of :func:`running_max` (``lax.associative_scan``)."""
    return lax.associative_scan(jnp.maximum, x)


def running_max_gpu(x):
    """The GPU form of :func:`running_max` (``lax.cummax``)."""
    return lax.cummax(x, axis=0)


def running_sum(x, dtype=None):
    """Inclusive running sum of x along axis 0 (bools count as ints), in ``dtype``."""
    return by_platform(_as(x, dtype), cpu=running_sum_cpu, gpu=running_sum_gpu)


def running_max(x):
    """Inclusive running maximum of x along axis 0 (of bools: whether any so far)."""
    x = jnp.asarray(x)
    if x.dtype == jnp.bool_:  # lax.cummax takes no bools
        return running_max(x.astype(jnp.int8)).astype(jnp.bool_)
    return by_platform(x, cpu=running_max_cpu, gpu=running_max_gpu)
