"""Halo regions of blocks padded in x and y (the decomposed axes).

A painted block has ``width`` extra cells on both sides of x and y; its
halo holds mass that belongs to the neighbours. On the 1x1 device grid the
neighbour is the block itself, on the opposite side (periodic box).
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax


def fold_periodic(padded, width: int):
    """Add each halo slab onto the cells it overlaps periodically; drop the halo.

    padded: (nx + 2w, ny + 2w, ...) -> (nx, ny, ...).
    """
    if width == 0:
        return padded
    w = width
    for axis in (0, 1):
        n = padded.shape[axis] - 2 * w
        core = lax.slice_in_dim(padded, w, w + n, axis=axis)
        low = lax.slice_in_dim(padded, 0, w, axis=axis)
        high = lax.slice_in_dim(padded, w + n, n + 2 * w, axis=axis)
        # the low halo covers the last w cells, the high halo the first w cells
        core = _add_slab(core, high, 0, axis)
        core = _add_slab(core, low, n - w, axis)
        padded = core
    return padded


def _add_slab(x, slab, start, axis):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, start + slab.shape[axis])
    return x.at[tuple(idx)].add(slab)


def pad_periodic(block, width: int):
    """Pad x and y by ``width`` cells with the periodic continuation."""
    if width == 0:
        return block
    pad = [(width, width), (width, width)] + [(0, 0)] * (block.ndim - 2)
    return jnp.pad(block, pad, mode="wrap")
