"""Buffers made where they are needed, not where XLA would hoist them."""

from __future__ import annotations

import jax.numpy as jnp


def zeros_after(shape, dtype, flags):
    """Zeros of ``shape`` made only once ``flags`` (a bool array) is computed.

    XLA makes a buffer of zeros (a broadcast of a constant) at the start of
    a program, or hoists it out of a loop, and keeps it until it is used:
    the paint's zero mesh would sit through a step's migration, the zero
    rows that clear the leavers through all its rounds (4 and 2 bytes per
    particle on 4x2). Here the zero is 0 times one of ``flags`` (0 or 1, so
    exactly 0), which XLA does not fold for floats: the zeros depend on the
    flags and cannot be made before them. (An optimization barrier does not
    do it: the CPU compiler removes it before it schedules.)
    """
    flags = jnp.ravel(flags)
    if flags.size == 0:  # nothing to depend on
        return jnp.zeros(shape, dtype)
    zero = flags[0].astype(jnp.float32) * 0.0
    return jnp.broadcast_to(zero.astype(dtype), shape)
