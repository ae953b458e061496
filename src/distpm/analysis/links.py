"""Pairs closer than a distance, and connected components, on one device's nodes.

No collectives. Nodes are points in a frame that never wraps (see
:mod:`distpm.parallel.ghosts`; the kNN's may, below): ``rel`` (n, 3)
[Mpc/h] in [0, extent) per axis. They are sorted by cell (for FoF, cubes of side >= the linking
distance), cells ordered by column (x, y) then z, so that the nodes of a
column are contiguous and sorted by their z cell. A dense table holds each column's
first node (columns grow as N^(2/3), cells would grow as N). A node's
candidate partners are in its own column (cells z and z + 1, after it) and
in the four columns (0, 1), (1, -1), (1, 0), (1, 1) (cells z - 1 .. z + 1):
half of the 27 neighbouring cells, so each pair is met once. Their ranges
in the sorted order come from short bisections within a column.

The kNN (:mod:`distpm.analysis.neighbours`) looks around a point within a
radius instead: in the 9 (or 25) columns around it, only the z cells that the ball
reaches (:func:`ball_columns`, in cells finer along z), whose ranges come
from a dense table of every cell's first node (:func:`cell_starts`). Along x
and y, on an axis of one device, its frame may be the box itself, without
ghosts: its columns then wrap around the box.

For FoF the candidates are enumerated one column of the half stencil at a
time, in chunks of a fixed number of pairs, and the pairs closer than the
distance (periodic minimum image of the global positions, the same
arithmetic on any device grid) are joined at once in a union-find forest
(:func:`union`, on the chunk's close pairs alone, compacted): no list of pairs
is kept, so none can overflow, and the work areas are a chunk's and a
column's ranges (8 bytes per node).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from distpm.ops import compact, running_max, running_sum, sorting
from distpm.parallel.decomposition import Decomposition
from distpm.parallel.layout import Layout

INT_MAX = np.iinfo(np.int32).max
_RANK_BLOCK = 1 << 20  # ranges ranked at a time by :class:`Candidates` (4 MiB of int32 ranks)
_JOIN_SHARE = 16  # :func:`_join` unites 1/16 of a chunk's pairs at a time
# the half stencil's columns (dx, dy), the node's own first
_STENCIL = ((0, 0), (0, 1), (1, -1), (1, 0), (1, 1))


def block_widths(cfg) -> list[float]:
    """[Mpc/h] width of a device's block along x, y, z."""
    return [b / p for b, p in zip(cfg.box_size, (*Decomposition.of(cfg).grid, 1), strict=True)]


def frame(cfg, layout, margin):
    """Block widths [Mpc/h] (3,) and a function giving the frame coordinates (``rel``, see
    :mod:`distpm.parallel.ghosts`) of the block's own positions (wrapped into the box) for a
    ghost layer ``margin`` [Mpc/h] wide (one for all axes, or one per axis)."""
    widths = block_widths(cfg)
    origin = [o * c for o, c in zip(layout.local_origin, cfg.cell_size, strict=True)]
    margins = list(margin) if np.ndim(margin) else [margin] * 3

    def rel(pos):
        shift = jnp.asarray([m - o for m, o in zip(margins, origin, strict=True)], pos.dtype)
        return pos + shift

    return widths, rel


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


def sort_by_cell(rel, mask, sides, n_cells):
    """Sort the nodes by cell; return (order, cells (n, 3) int32 of the sorted nodes).

    sides [Mpc/h]: the cells' side, one float or one per axis (3,)."""
    nx, ny, nz = n_cells
    cells = jnp.floor(rel / jnp.asarray(sides, rel.dtype)).astype(jnp.int32)
    cells = jnp.clip(cells, 0, jnp.asarray([nx - 1, ny - 1, nz - 1])) + 1  # padding layer: 0
    key = cell_keys(cells, n_cells)
    order = sorting.argsort(jnp.where(mask, key, INT_MAX))
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


def column_table(cells, valid, n_cells):
    """Per sorted node its column; per column its first sorted node and its count."""
    nx, ny, _ = n_cells
    column = cells[:, 0] * (ny + 2) + cells[:, 1]
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), column, (nx + 2) * (ny + 2))
    return column, running_sum(counts) - counts, counts


def cell_starts(cells, valid, n_cells):
    """Per cell key, and one past the last, the first sorted node at or after that cell.

    A dense table of (nx + 2)(ny + 2)(nz + 2) + 1 int32 (the kNN's; FoF's
    finer cells use :func:`column_table` and bisections, which need less
    memory where there are more cells than nodes). Where it fits, it finds
    ranges 5-10 times faster than the bisections.
    """
    key = cell_keys(cells, n_cells)
    counts = jax.ops.segment_sum(valid.astype(jnp.int32), key, math.prod(m + 2 for m in n_cells))
    return jnp.concatenate([jnp.zeros(1, jnp.int32), running_sum(counts, jnp.int32)])


def cell_keys(cells, n_cells):
    """Cell key (int32) of cells (n, 3) (padding layer included): x, then y, then z."""
    _, ny, nz = n_cells
    return (cells[:, 0] * (ny + 2) + cells[:, 1]) * (nz + 2) + cells[:, 2]


def ball_columns(point, cell, sides, radius: float, n_cells, within=None, wrap=(False, False)):
    """The columns (x, y) around each point that a ball of ``radius`` [Mpc/h] reaches, and in
    each the z cells that can hold a node within the radius: (column, lo, hi) (m, c) int32
    each, cells lo..hi inclusive (lo > hi: none).

    point (m, 3): frame coordinates; cell (m, 3): its cell as from
    :func:`sort_by_cell`; sides: the cells' sides (3,) [Mpc/h], z ones
    possibly finer than x and y. The columns are those at offsets
    -s..s in x and y, s = ceil(radius / side): c = 9 where the x, y sides
    reach the radius, 25 where they reach half of it. A node in a column
    whose nearest face is g away in (x, y) is within ``radius`` only if its
    z is within sqrt(radius^2 - g^2) of the point's. In columns ``radius``
    wide that is 12.5 radius^3 of the 27 radius^3 of the cells around the
    point, plus the z cells cut at both ends: 13-16.5 radius^3 for z cells
    16-2 times finer. ``within`` (m,) [Mpc/h], at most ``radius``: each point's own radius,
    which trims its columns and z cells further (the columns listed stay those of
    ``radius``). The frame must reach ``radius`` beyond the points
    (ghosts) for all of them to exist; those past the frame's padding
    layer are listed as column 0, empty. Along an axis that ``wrap``s (x, y), the
    frame is the box itself, its cells tile it, and the columns past one face are those
    at the other (their nodes' periodic images); the cells must then number at least
    2 ceil(radius / side) + 1 along it, so that no column is listed twice.
    """
    nx, ny, nz = n_cells
    reach = column_reach(radius, sides)
    offsets = range(-reach, reach + 1)
    gap2 = []  # per axis x, y: squared distance to the column at each offset
    for a in (0, 1):
        near = []
        for d in offsets:  # cell c spans [(c - 1) side, c side) (cell 0 is padding)
            if d < 0:
                g = jnp.maximum(point[:, a] - (cell[:, a] + d) * sides[a], 0)
            elif d > 0:
                g = jnp.maximum((cell[:, a] + d - 1) * sides[a] - point[:, a], 0)
            else:
                g = jnp.zeros_like(point[:, a])
            near.append(g * g)
        gap2.append(near)
    z = point[:, 2] / sides[2] + 1
    r2 = radius * radius if within is None else within * within
    out = []

    def inside(c, d, m, wraps):  # (padding included)
        return True if wraps else (c + d >= 0) & (c + d <= m + 1)

    def step(c, d, m, wraps):  # the cell d away from c (the padding layer is never wrapped to)
        return (c - 1 + d) % m + 1 if wraps else c + d

    for i, dx in enumerate(offsets):
        for j, dy in enumerate(offsets):
            g2 = gap2[0][i] + gap2[1][j]
            h = jnp.sqrt(jnp.maximum(r2 - g2, 0)) / sides[2]
            lo = jnp.clip(jnp.floor(z - h), 0, nz + 1).astype(jnp.int32)
            hi = jnp.clip(jnp.floor(z + h), 0, nz + 1).astype(jnp.int32)
            near = (g2 <= r2) & inside(cell[:, 0], dx, nx, wrap[0])
            near = near & inside(cell[:, 1], dy, ny, wrap[1])
            x, y = step(cell[:, 0], dx, nx, wrap[0]), step(cell[:, 1], dy, ny, wrap[1])
            column_at = jnp.where(near, x * (ny + 2) + y, 0)
            out.append((column_at, lo, jnp.where(near, hi, lo - 1)))
    return [jnp.stack(x, axis=1) for x in zip(*out, strict=True)]


def column_reach(radius: float, sides) -> int:
    """How many columns of sides (x, y) ``sides`` [Mpc/h] a ball of ``radius`` reaches on
    each side of its own: :func:`ball_columns` lists (2 reach + 1)^2."""
    return max(math.ceil(radius / sides[a] - 1e-9) for a in (0, 1))


def spans_from_table(starts_of, columns, n_cells, active):
    """(starts, lengths) (m, c) int32 of the sorted nodes in :func:`ball_columns`' cells,
    from the table of :func:`cell_starts`; rows not ``active`` get empty ranges."""
    column, lo, hi = columns
    base = column * (n_cells[2] + 2)
    starts, ends = starts_of[base + lo], starts_of[base + jnp.maximum(hi + 1, lo)]
    return starts, jnp.where(active[:, None], ends - starts, 0)


def candidate_range(table, cz, valid, n_cells, column, own_first):
    """(start, length) (n,) int32: the sorted-node range of each node's candidate partners in
    one column of the half stencil.

    table: :func:`column_table` of the sorted nodes; cz (n,) their z cells; column: the
    column's offset (dx, dy) from the node's own (traced or not); own_first: whether it is
    the node's own column (cells z and z + 1, after the node) rather than another (cells
    z - 1 .. z + 1). One column at a time keeps the ranges at 8 bytes per node.
    """
    col, first, counts = table
    other = col + column[0] * (n_cells[1] + 2) + column[1]
    lo, hi = first[other], first[other] + counts[other]
    node = jnp.arange(cz.shape[0], dtype=jnp.int32)
    start = jnp.where(own_first, node + 1, _first_at_least(cz, lo, hi, cz - 1))
    length = jnp.maximum(_first_at_least(cz, lo, hi, cz + 2) - start, 0)
    return start, jnp.where(valid, length, 0)


class Candidates:
    """Ragged lists of candidate partners: row r has ``lengths[r, i]`` partners starting
    at ``starts[r, i]`` for each of its ranges i, enumerated ``chunk`` at a time.

    The non-empty ranges are listed first, in row order, so that the ranges
    starting in a chunk are at most ``chunk`` consecutive entries: a chunk
    costs O(chunk), however many rows and ranges there are. A slot finds its
    range by a running maximum, then its row and partner by one gather each.
    """

    def __init__(self, starts, lengths, chunk: int):
        self.chunk = chunk
        n, n_ranges = lengths.shape
        flat = lengths.reshape(-1)
        if flat.shape[0] + chunk >= 2**31:
            raise ValueError(
                f"{n} rows of {n_ranges} ranges each: more ranges than int32 numbers; "
                "use more devices"
            )
        listed, _ = compact(flat > 0, flat.shape[0] + chunk, block=_RANK_BLOCK)  # non-empty first
        length = jnp.take(flat, listed, mode="fill", fill_value=0)
        self.offset = running_sum(length) - length  # first slot of each listed range
        # the slot s of listed range j holds partner s + shift[j], of row[j]
        start = jnp.take(starts.reshape(-1), listed, mode="fill", fill_value=0)
        self.shift = start - self.offset
        self.row = jnp.minimum(listed // n_ranges, n - 1)
        self.total = jnp.sum(flat)
        self.examined = jnp.sum(flat.astype(jnp.float32))  # to detect int32 overflow

    def n_chunks(self):
        return (self.total + self.chunk - 1) // self.chunk

    def chunk_at(self, c):
        """(row, partner, valid) of the ``chunk`` slots from slot c * chunk."""
        return self.slots_from(c * self.chunk)

    def slots_from(self, s0):
        """(row, partner, valid) of the ``chunk`` slots from slot ``s0`` (any)."""
        chunk = self.chunk
        slots = s0 + jnp.arange(chunk, dtype=jnp.int32)
        # the listed range of each slot: mark where ranges start, then a running maximum
        first = jnp.searchsorted(self.offset, s0, side="right").astype(jnp.int32) - 1
        window = lax.dynamic_slice_in_dim(self.offset, first, chunk)
        at = jnp.where((window >= s0) & (window < s0 + chunk), window - s0, chunk)
        local = jnp.arange(chunk, dtype=jnp.int32)
        mark = jnp.full(chunk + 1, 0, jnp.int32).at[at].max(local)  # slot ``chunk``: the rest
        listed = first + running_max(mark[:chunk])
        return self.row[listed], slots + self.shift[listed], slots < self.total


def columns(x):
    """The columns of x (n, c): XLA's CPU gathers single numbers several times faster
    per number than whole rows (measured on (n, 3) positions)."""
    return tuple(x[:, i] for i in range(x.shape[1]))


def periodic_d2(a, b, box):
    """Squared minimum-image distances between points a and b [Mpc/h].

    a, b: the points' coordinates, a sequence of 3 arrays (one per axis),
    each in [0, L) of that axis; box: (3,) [Mpc/h] floats. The box is taken
    off the point near the far face before subtracting (x - L is exact for
    x in [L/2, 2L]), so pairs across the boundary are as precise as the
    others in float32.
    """
    d2 = 0
    for x, y, size in zip(a, b, box, strict=True):
        size = float(size)
        # the image that brings y nearest x: +L, -L or none
        up, down = x - y > size / 2, y - x > size / 2
        d = jnp.where(up, x - size, x) - jnp.where(down, y - size, y)
        d2 = d2 + d * d
    return d2


def friends(xyz, cells, valid, n_cells, box_size, distance: float, chunk: int, same):
    """Per sorted node, the smallest node joined to it by chains of pairs closer than
    ``distance`` [Mpc/h] (periodic) or of the pairs ``same`` (u, v) (n,) int32 (periodic
    images of one particle; (0, 0) for none); and the most candidates examined in one
    column (float, to detect int32 overflow).

    xyz: the sorted nodes' global positions [Mpc/h], three (n,) arrays (:func:`columns`);
    cells, valid: as from :func:`sort_by_cell`; box_size: 3 Python floats [Mpc/h]. The
    columns of the half stencil are taken one at a time (:func:`candidate_range`,
    :func:`link_close_pairs`).
    """
    table, cz = column_table(cells, valid, n_cells), cells[:, 2]
    parent = union(Layout.varying(jnp.arange(cz.shape[0], dtype=jnp.int32)), *same)
    stencil = jnp.asarray(_STENCIL, jnp.int32)

    def column(i, state):
        parent, examined = state
        start, length = candidate_range(table, cz, valid, n_cells, stencil[i], i == 0)
        parent, seen = link_close_pairs(parent, xyz, start, length, box_size, distance, chunk)
        return parent, jnp.maximum(examined, seen)

    examined = Layout.varying(jnp.zeros((), jnp.float32))
    parent, examined = lax.fori_loop(0, len(_STENCIL), column, (parent, examined))
    return roots(parent), examined


def link_close_pairs(parent, xyz, start, length, box_size, distance: float, chunk: int):
    """Join, in the forest ``parent``, the sorted nodes closer than ``distance`` [Mpc/h]
    (periodic) among each node's candidates ``start``, ``length`` (n,) (one column of
    :func:`candidate_range`).

    xyz: the sorted nodes' global positions [Mpc/h] (:func:`columns`); box_size: 3 Python
    floats [Mpc/h]. The pairs are joined a chunk of candidates at a time as they are found
    (:func:`union`), so no list of pairs exists and none can overflow. Returns the forest
    and the number of candidates examined (float, to detect int32 overflow).
    """
    reach = jnp.asarray(distance, xyz[0].dtype) ** 2
    cand = Candidates(start[:, None], length[:, None], chunk)

    def body(state):
        c, parent = state
        node, partner, valid = cand.chunk_at(c)
        d2 = periodic_d2(
            [x[node] for x in xyz], [jnp.take(x, partner, mode="clip") for x in xyz], box_size
        )
        return c + 1, _join(parent, node, partner, valid & (d2 <= reach))

    start = (jnp.zeros((), jnp.int32), parent)
    _, parent = lax.while_loop(lambda s: s[0] < cand.n_chunks(), body, start)
    return parent, cand.examined


def _join(parent, u, v, link):
    """:func:`union` of the pairs (u, v) where ``link``, compacted and joined 1/_JOIN_SHARE
    of the chunk at a time: few candidates link, and the union's loops run over those alone.
    The last slice, clamped to the end, may take pairs joined already: a union repeated is
    the same forest."""
    n = u.shape[0]
    block = max(1, n // _JOIN_SHARE)
    source, count = compact(link, n, block=n)
    u = jnp.take(u, source, mode="fill", fill_value=0)
    v = jnp.take(v, source, mode="fill", fill_value=0)

    def join(state):
        start, parent = state
        pair = [lax.dynamic_slice_in_dim(x, start, block) for x in (u, v)]
        return start + block, union(parent, *pair)

    return lax.while_loop(lambda s: s[0] < count, join, (jnp.zeros_like(count), parent))[1]


def _find(parent, x):
    """The roots of the nodes x in the forest ``parent``."""

    def up(state):  # one gather a step: the parents are carried
        _, px = state
        return px, parent[px]

    return lax.while_loop(lambda s: jnp.any(s[0] != s[1]), up, (x, parent[x]))[0]


def union(parent, u, v):
    """The forest ``parent`` with the trees of u and v (m,) int32 joined pairwise.

    Each tree's root is its smallest node: a root is hooked onto a smaller root only
    (a scatter-min, so of two hooks of one root in a round the smaller wins and the
    other pair is joined in the next), until u and v share their roots; then u, v and
    their former roots point straight at them (path compression). Pairs (0, 0) join
    nothing.
    """

    def hook(state):
        parent, ru, rv = state
        parent = parent.at[jnp.maximum(ru, rv)].min(jnp.minimum(ru, rv))
        return parent, _find(parent, ru), _find(parent, rv)

    ru, rv = _find(parent, u), _find(parent, v)
    parent, root, _ = lax.while_loop(lambda s: jnp.any(s[1] != s[2]), hook, (parent, ru, rv))
    # the pairs and their former roots point at the new root: trees stay shallow
    for x in (u, v, ru, rv):
        parent = parent.at[x].set(root)
    return parent


def roots(parent):
    """Per node, the root of its tree in the forest ``parent``: its component's smallest node."""

    def jump(state):
        _, pp = state
        return pp, pp[pp]

    return lax.while_loop(lambda s: jnp.any(s[0] != s[1]), jump, (parent, parent[parent]))[0]


def runs(k0, k1):
    """For keys (k0, k1) sorted lexicographically: each element's run index, a flag on the
    first element of each run, and the index of that first element (the run's head)."""
    first = jnp.concatenate([jnp.ones(1, bool), (k0[1:] != k0[:-1]) | (k1[1:] != k1[:-1])])
    run = running_sum(first) - 1
    n = run.shape[0]
    index = jnp.arange(n, dtype=jnp.int32)
    head = jnp.zeros(n, jnp.int32).at[jnp.where(first, run, n)].set(index, mode="drop")[run]
    return run, first, head


def smallest_key(keys, valid, root, n: int):
    """Per node, the lexicographically smallest (n, 2) int32 key among valid nodes with its root."""
    k0 = jnp.where(valid, keys[:, 0], INT_MAX)
    m0 = jax.ops.segment_min(k0, root, n)[root]
    k1 = jnp.where(valid & (k0 == m0), keys[:, 1], INT_MAX)
    m1 = jax.ops.segment_min(k1, root, n)[root]
    return jnp.stack([m0, m1], axis=1)
