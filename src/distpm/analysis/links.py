"""Pairs closer than a distance, and connected components, on one device's nodes.

No collectives. Nodes are points in a frame that never wraps (see
:mod:`distpm.parallel.ghosts`): ``rel`` (n, 3) [Mpc/h] in [0, extent) per
axis. They are sorted by cell (cubes of side >= the linking distance), cells
ordered by column (x, y) then z, so that the nodes of a column are
contiguous and sorted by their z cell. A dense table holds each column's
first node (columns grow as N^(2/3), cells would grow as N). A node's
candidate partners are in its own column (cells z and z + 1, after it) and
in the four columns (0, 1), (1, -1), (1, 0), (1, 1) (cells z - 1 .. z + 1):
half of the 27 neighbouring cells, so each pair is met once. Their ranges
in the sorted order come from short bisections within a column.

The candidates are enumerated in chunks of a fixed number of pairs, and the
pairs closer than the distance (periodic minimum image of the global
positions, the same arithmetic on any device grid) are written to an edge
buffer of fixed size; the needed size is reported.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from distpm.parallel.layout import Layout

INT_MAX = np.iinfo(np.int32).max
# the half stencil's other columns (dx, dy); the node's own column comes first
_COLUMNS = ((0, 1), (1, -1), (1, 0), (1, 1))


def cell_grid(extent, distance: float):
    """(side [Mpc/h], cells per axis) for a frame of ``extent`` (3,) [Mpc/h].

    Cells are at least ``distance`` wide, and wider if needed so that the
    cell keys (with a layer of empty padding cells on each side) fit int32.
    """
    side = distance
    while True:
        n = tuple(max(1, math.ceil(e / side)) for e in extent)
        if math.prod(m + 2 for m in n) < 2**30:
            return side, n
        side *= 1.25


def sort_by_cell(rel, mask, side: float, n_cells):
    """Sort the nodes by cell; return (order, cells (n, 3) int32 of the sorted nodes)."""
    nx, ny, nz = n_cells
    cells = jnp.floor(rel / jnp.asarray(side, rel.dtype)).astype(jnp.int32)
    cells = jnp.clip(cells, 0, jnp.asarray([nx - 1, ny - 1, nz - 1])) + 1  # padding layer: 0
    key = (cells[:, 0] * (ny + 2) + cells[:, 1]) * (nz + 2) + cells[:, 2]
    order = jnp.argsort(jnp.where(mask, key, INT_MAX))
    return order, cells[order]


def _first_at_least(cz, lo, hi, z):
    """Per query, the first index in [lo, hi) with cz[index] >= z (cz sorted there); else hi."""

    def body(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        right = (lo < hi) & (jnp.take(cz, mid, mode="clip") < z)
        return jnp.where(right, mid + 1, lo), jnp.where((lo < hi) & ~right, mid, hi)

    # bisection halves the longest range each step: ceil(log2(longest + 1)) steps
    steps = 32 - lax.clz(jnp.max(hi - lo))
    lo, _ = lax.fori_loop(0, steps, body, (lo, hi))
    return lo


def candidate_ranges(cells, valid, n_cells):
    """(starts, lengths) (n, 5) int32: the sorted-node ranges of each node's candidate partners."""
    nx, ny, nz = n_cells
    n = cells.shape[0]
    column = cells[:, 0] * (ny + 2) + cells[:, 1]
    n_columns = (nx + 2) * (ny + 2)
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), column, n_columns)
    first = jnp.cumsum(counts) - counts
    cz = cells[:, 2]
    node = jnp.arange(n, dtype=jnp.int32)
    los, his, zs = [first[column]], [first[column] + counts[column]], [cz + 2]
    for dx, dy in _COLUMNS:
        other = column + dx * (ny + 2) + dy
        lo, hi = first[other], first[other] + counts[other]
        los += [lo, lo]
        his += [hi, hi]
        zs += [cz - 1, cz + 2]
    found = _first_at_least(cz, jnp.concatenate(los), jnp.concatenate(his), jnp.concatenate(zs))
    found = found.reshape(9, n)
    starts = jnp.stack([node + 1, found[1], found[3], found[5], found[7]], axis=1)
    ends = jnp.stack([found[0], found[2], found[4], found[6], found[8]], axis=1)
    lengths = jnp.where(valid[:, None], jnp.maximum(ends - starts, 0), 0)
    return starts, lengths


def close_pairs(pos, starts, lengths, box_size, distance: float, capacity: int, chunk: int):
    """Pairs (u, v) of sorted nodes closer than ``distance`` [Mpc/h] (periodic).

    pos: (n, 3) [Mpc/h] global positions of the sorted nodes; box_size: (3,)
    [Mpc/h]. Returns (u, v) (capacity,) int32 (zeros past the end), the
    number of pairs found (which may exceed ``capacity``: nothing past it is
    kept) and the number of candidates examined (float, to detect int32 overflow).
    """
    n = pos.shape[0]
    box = jnp.asarray(box_size, pos.dtype)
    reach = jnp.asarray(distance, pos.dtype) ** 2
    per_node = jnp.sum(lengths, axis=1)
    offset = jnp.cumsum(per_node) - per_node
    total = jnp.sum(per_node)
    within = jnp.cumsum(lengths, axis=1)  # end of each range within a node's candidates
    node_index = jnp.arange(n, dtype=jnp.int32)

    def body(state):
        c, u, v, found = state
        s0 = c * chunk
        slots = s0 + jnp.arange(chunk, dtype=jnp.int32)
        # the node each slot belongs to: mark where nodes start, then a running maximum
        first = jnp.searchsorted(offset, s0, side="right").astype(jnp.int32) - 1
        at = jnp.where((offset >= s0) & (offset < s0 + chunk), offset - s0, chunk)
        mark = jnp.full(chunk, -1, jnp.int32).at[0].set(first).at[at].max(node_index, mode="drop")
        node = lax.cummax(mark)
        rank = slots - offset[node]
        ends = within[node]
        part = jnp.sum(rank[:, None] >= ends, axis=1)
        part = jnp.minimum(part, 4)
        ends_p = jnp.take_along_axis(ends, part[:, None], axis=1)[:, 0]
        len_p = jnp.take_along_axis(lengths[node], part[:, None], axis=1)[:, 0]
        start_p = jnp.take_along_axis(starts[node], part[:, None], axis=1)[:, 0]
        partner = start_p + rank - (ends_p - len_p)
        d = pos[node] - jnp.take(pos, partner, axis=0, mode="clip")
        d = d - box * jnp.round(d / box)
        link = (slots < total) & (jnp.sum(d * d, axis=1) <= reach)
        target = jnp.where(link, found + jnp.cumsum(link) - 1, capacity)
        u = u.at[target].set(node, mode="drop")
        v = v.at[target].set(partner, mode="drop")
        return c + 1, u, v, found + jnp.sum(link, dtype=jnp.int32)

    empty = Layout.varying(jnp.zeros(capacity, jnp.int32))
    start = (jnp.zeros((), jnp.int32), empty, empty, Layout.varying(jnp.zeros((), jnp.int32)))
    _, u, v, found = lax.while_loop(lambda s: s[0] * chunk < total, body, start)
    return u, v, found, jnp.sum(per_node.astype(jnp.float32))


def components(u, v, n: int):
    """Connected components of n nodes linked by edges (u, v): the smallest node of each.

    Hooking of roots onto smaller roots with pointer jumping, until no edge
    joins two roots and every node points at its root. Unused edge slots
    are (0, 0).
    """

    def body(state):
        parent, _ = state
        pu, pv = parent[u], parent[v]
        hooked = parent.at[jnp.maximum(pu, pv)].min(jnp.minimum(pu, pv))
        jumped = hooked[hooked]
        jumped = jumped[jumped]
        return jumped, jnp.any(jumped != parent)

    parent = Layout.varying(jnp.arange(n, dtype=jnp.int32))
    parent, _ = lax.while_loop(lambda s: s[1], body, body((parent, None)))
    return parent


def smallest_key(keys, valid, root, n: int):
    """Per node, the lexicographically smallest (n, 2) int32 key among valid nodes with its root."""
    k0 = jnp.where(valid, keys[:, 0], INT_MAX)
    m0 = jax.ops.segment_min(k0, root, n)[root]
    k1 = jnp.where(valid & (k0 == m0), keys[:, 1], INT_MAX)
    m1 = jax.ops.segment_min(k1, root, n)[root]
    return jnp.stack([m0, m1], axis=1)
