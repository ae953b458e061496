"""Ghost particles: copies of the particles within a distance w of a block's faces.

Runs inside ``shard_map``. Analysis that links particles closer than w
(friends-of-friends) sees, on each device, its own particles plus copies of
every particle within w of its block, so that every close pair is found on
the device of each of its two members.

Frame: per axis, a node's coordinate relative to this block, shifted by w,
``rel = pos - origin + w``: the block's own particles lie in [w, n + w),
where n is the block's width [Mpc/h] along the axis (the box size along an
axis with one device, and along z, never split), and the ghosts in [0, w)
and [n + w, n + 2w). The frame never wraps: along an axis with one device
the ghosts are the block's own particles near the opposite face, shifted by
the box size (periodic images, made without communication). Positions
``pos`` keep their global values.

Three passes, along x, y, then z: each pass copies the nodes (owned and
earlier ghosts) near the two faces of its axis, so that corners and edges
reach the diagonal neighbours. A pass sends at most ``size`` nodes across
each face; the needed size is reported, never silently cut. A pass of size
0 is skipped: along an axis of one device, a caller that wraps its lookups
around the box (the kNN's cells) needs no images there, and its frame has
no margin along it (w = 0).
"""

from __future__ import annotations

import jax.numpy as jnp

from distpm.ops import compact
from distpm.parallel.halo import shift

_PASSES = ((0, "x"), (1, "y"), (2, None))


def _take(x, index):
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


def _send(x, source, name, p: int, step: int):
    """Rows ``x[source]`` sent to the next (step +1) or previous (-1) device along ``name``."""
    return shift(_take(x, source), name, p, step)


def plan(rel, mask, width, margin, grid, sizes):
    """Which nodes each pass copies, and the frame coordinates of all nodes.

    rel: (n, 3) frame coordinates of this device's particles; mask: (n,)
    valid slots; width: (3,) block widths [Mpc/h] (static floats); margin:
    w [Mpc/h], one for all axes or one per axis (3,); sizes: (3,) slots per face in the
    pass along each axis (0: no pass, on an axis of one device). Returns ``(sources, rel,
    mask, image_of, needed)``: ``sources`` for :func:`fetch`; ``rel`` and
    ``mask`` of all nodes (particles first, then each pass's ghosts);
    ``image_of`` (nodes,) int32, for a periodic image the node it copies on
    this device, else -1; ``needed`` (3,) int32 the number of nodes each
    pass had to send across one face (the larger of the two faces).
    """
    sources = []
    image_of = jnp.full(mask.shape, -1, jnp.int32)
    needed = []
    margins = (
        list(margin) if isinstance(margin, (list, tuple)) or jnp.ndim(margin) else [margin] * 3
    )
    for (axis, name), size, margin in zip(_PASSES, sizes, margins, strict=True):
        p = grid[axis] if name else 1
        if size == 0:
            if p != 1:
                raise ValueError(f"an axis of {p} devices needs ghosts")
            sources.append(None)
            needed.append(jnp.zeros((), jnp.int32))
            continue
        low = mask & (rel[:, axis] < 2 * margin)  # within w of the low face
        high = mask & (rel[:, axis] >= width[axis])  # within w of the high face
        low_src, n_low = compact(low, size)
        high_src, n_high = compact(high, size)
        sources.append((low_src, high_src))
        needed.append(jnp.maximum(n_low, n_high))
        # the previous device sees my low-face nodes beyond its high face, and so on
        step = jnp.zeros(3, rel.dtype).at[axis].set(width[axis])
        rel = jnp.concatenate(
            [rel, _send(rel + step, low_src, name, p, -1), _send(rel - step, high_src, name, p, +1)]
        )
        mask = jnp.concatenate(
            [mask, _send(mask, low_src, name, p, -1), _send(mask, high_src, name, p, +1)]
        )
        if p == 1:  # images of my own nodes
            copies = [jnp.where(src < low.shape[0], src, -1) for src in (low_src, high_src)]
        else:
            copies = [jnp.full(size, -1, jnp.int32)] * 2
        image_of = jnp.concatenate([image_of, *copies])
    return sources, rel, mask, image_of, jnp.stack(needed)


def fetch(sources, x, grid):
    """Append the ghosts' values to ``x`` (n, ...): the nodes' values, in :func:`plan`'s order.

    Sends what the neighbours hold now: call it again after the owners'
    values changed (labels during a merge).
    """
    for (axis, name), pair in zip(_PASSES, sources, strict=True):
        if pair is None:  # a pass skipped
            continue
        low_src, high_src = pair
        p = grid[axis] if name else 1
        x = jnp.concatenate([x, _send(x, low_src, name, p, -1), _send(x, high_src, name, p, +1)])
    return x
