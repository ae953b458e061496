"""Halo exchange of padded blocks, inside ``shard_map``.

A painted block carries ``low`` extra cells before and ``high`` after its
own cells along each axis. Its halo holds mass that belongs to the
neighbours: :func:`add_halo` sends each halo slab to the neighbour that owns
those cells and adds it there; :func:`fill_halo` is its transpose, filling
the halo with the neighbours' values before interpolation. Along z, and along
an axis with one device, the neighbour is the block itself, on the opposite side
(periodic box), and nothing is sent. The x pass carries the y halo along, so
the corners reach the diagonal neighbours through the y pass.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

_AXES = ((0, "x"), (1, "y"), (2, None))  # z is never split


def shift(x, name: str, p: int, step: int):
    """Send ``x`` from device i to device i + step (mod p) along mesh axis ``name``."""
    if p == 1:
        return x
    return lax.ppermute(x, name, [(i, (i + step) % p) for i in range(p)])


def add_halo(padded, low: int, high: int, grid):
    """Add halo slabs into the cells they overlap (periodically); drop the halo.

    padded: (nx + low + high, ny + low + high, nz + low + high, ...) -> (nx, ny, nz, ...).
    """
    for axis, name in _AXES:
        p = grid[axis] if name else 1
        n = padded.shape[axis] - low - high
        core = lax.slice_in_dim(padded, low, low + n, axis=axis)
        if high:  # my high halo is the next block's first cells
            slab = lax.slice_in_dim(padded, low + n, low + n + high, axis=axis)
            core = _add_at(core, shift(slab, name, p, +1), 0, axis)
        if low:  # my low halo is the previous block's last cells
            slab = lax.slice_in_dim(padded, 0, low, axis=axis)
            core = _add_at(core, shift(slab, name, p, -1), n - low, axis)
        padded = core
    return padded


def fill_halo(block, low: int, high: int, grid):
    """Pad a block with ``low`` cells of the previous and ``high`` of the next block."""
    for axis, name in _AXES:
        p = grid[axis] if name else 1
        n = block.shape[axis]
        parts = [block]
        if low:
            prev = shift(lax.slice_in_dim(block, n - low, n, axis=axis), name, p, +1)
            parts.insert(0, prev)
        if high:
            parts.append(shift(lax.slice_in_dim(block, 0, high, axis=axis), name, p, -1))
        block = jnp.concatenate(parts, axis=axis)
    return block


def _add_at(x, slab, start, axis):
    idx = [slice(None)] * x.ndim
    idx[axis] = slice(start, start + slab.shape[axis])
    return x.at[tuple(idx)].add(slab)
