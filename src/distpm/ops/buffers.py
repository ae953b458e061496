"""Buffers made where they are needed, not where XLA would hoist them."""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def zeros_after(shape, dtype, after):
    """Zeros of ``shape`` made only once the array ``after`` is computed.

    XLA makes a buffer of zeros (a broadcast of a constant) at the start of
    a program, or hoists it out of a loop, and keeps it until it is used;
    two such buffers of one shape become one (common subexpressions), kept
    from the first use to the last: the paint's zero mesh would sit through
    a step's migration, the zero rows that clear the leavers through all its
    rounds (4 and 2 bytes per particle on 4x2), and a gradient would keep
    the zeros of a density's adjoint through the whole adjoint of the steps
    (12). Here the zero is |v * 0| for ``after``'s first element v (its real part; for a
    bool, 1 or 2; a value that is not finite taken as 0, so the zero is exactly +0). No
    compiler folds that for floats: the zeros depend on ``after``, cannot be made before
    it, and are not shared with zeros made after another array. (0 times a flag made
    from a bool, which this was, the GPU compiler turns into a constant: its zeros were
    made at the start and shared, 18 bytes per particle more in the initial conditions.)
    ``after`` must be computed at run time: a mask that XLA can work out while compiling
    (all true on one device) leaves constant zeros. (An optimization barrier does not do
    it: the CPU compiler removes it before it schedules.) None, or an empty array, gives
    plain zeros.
    """
    if after is None or jnp.size(after) == 0:  # nothing to depend on
        return jnp.zeros(shape, dtype)
    v = jnp.ravel(after)[0]
    if v.dtype == jnp.bool_:
        v = jnp.where(v, 1.0, 2.0)
    v = jnp.real(v).astype(jnp.float32)
    # no derivative flows into ``after`` (a cotangent of inf, as d P(k) / dk at k = 0, times 0)
    zero = lax.stop_gradient(jnp.abs(jnp.where(jnp.isfinite(v), v, 0.0) * 0.0))
    return jnp.broadcast_to(zero.astype(dtype), shape)
