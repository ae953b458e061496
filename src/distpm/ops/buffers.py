"""Buffers made where they are needed, not where XLA would hoist them."""

from __future__ import annotations

import jax.numpy as jnp


def zeros_after(shape, dtype, after):
    """Zeros of ``shape`` made only once the array ``after`` is computed.

    XLA makes a buffer of zeros (a broadcast of a constant) at the start of
    a program, or hoists it out of a loop, and keeps it until it is used;
    two such buffers of one shape become one (common subexpressions), kept
    from the first use to the last: the paint's zero mesh would sit through
    a step's migration, the zero rows that clear the leavers through all its
    rounds (4 and 2 bytes per particle on 4x2), and a gradient would keep
    the zeros of a density's adjoint through the whole adjoint of the steps
    (12). Here the zero is 0 times a flag of ``after``'s first element (a
    bool itself, or whether a number is NaN: 0 or 1, so exactly 0), which
    XLA does not fold for floats: the zeros depend on ``after``, cannot be
    made before it, and are not shared with zeros made after another array.
    ``after`` must be computed at run time: a mask that XLA can work out
    while compiling (all true on one device) leaves constant zeros. (An
    optimization barrier does not do it: the CPU compiler removes it before
    it schedules.) None, or an empty array, gives plain zeros.
    """
    if after is None or jnp.size(after) == 0:  # nothing to depend on
        return jnp.zeros(shape, dtype)
    after = jnp.ravel(after)
    flag = after[0] if after.dtype == jnp.bool_ else jnp.isnan(after[0])
    zero = flag.astype(jnp.float32) * 0.0
    return jnp.broadcast_to(zero.astype(dtype), shape)
