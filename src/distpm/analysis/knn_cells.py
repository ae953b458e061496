"""The grids of cells of the kNN's passes: radii, which passes share a grid, cell sides,
wrapping around the box, ghost buffer sizes (see :mod:`distpm.analysis.neighbours`).
Host-side planning from the config alone: no arrays."""

from __future__ import annotations

import math

import numpy as np

from distpm.analysis import links
from distpm.parallel.decomposition import Decomposition

TABLE = 8  # cell tables of up to TABLE cells per node (an int32 start and, while built, count)


def radii(cfg, k: int, max_radius: float | None) -> tuple[float, ...]:
    """[Mpc/h] the passes' radii: from 1/4 of the mean k-th neighbour distance t (dense
    regions) up to ``max_radius`` (default 8 t), doubling."""
    density = cfg.n_particles / math.prod(cfg.box_size)
    typical = (k / (4 / 3 * math.pi * density)) ** (1 / 3)
    grid = Decomposition.of(cfg).grid
    reach = [w / 2 for w, p in zip(links.block_widths(cfg), grid, strict=False) if p > 1]
    top = min([*reach, min(cfg.box_size) / 4, max_radius or 8 * typical])
    out = [min(top, typical / 4)]
    while out[-1] < top:
        out.append(min(top, out[-1] * 2))
    return tuple(out)


def groups(radii, cfg=None):
    """The passes' radii by grid: two by two, the last alone (its ghosts are the widest,
    and it seldom runs). Where a radius is left over before the last and the pair before
    it wraps around the box along x or y with it (:func:`wraps`), it joins that pair
    rather than take a grid of its own, whose sort of every node costs more than the few
    rows that ask there.
    """
    first = radii[:-1]
    pairs = [tuple(first[i : i + 2]) for i in range(0, len(first), 2)]
    if cfg is not None and len(pairs) > 1 and len(pairs[-1]) == 1:
        joined = pairs[-2] + pairs[-1]
        if any(wraps(cfg, joined)):
            pairs[-2:] = [joined]
    return [*pairs, tuple(radii[-1:])]


def cells(extent, radius, n_nodes, widest, wrap=(False, False, False), table=TABLE):
    """The cells of a pass: (sides (3,) [Mpc/h], cells per axis). They are listed in a
    dense table of at most ``table`` int32 per node. Columns (x, y) are ``radius`` wide, or
    wider where the table would not fit; along z the cells are 2 to 16 times finer, since
    :func:`distpm.analysis.links.ball_columns` keeps only the z cells a ball reaches.

    No side grows past ``widest`` (3,) [Mpc/h] (:func:`widest`), where the table may then
    hold more: beyond it, two copies of a particle in the frame, a box apart, could both be
    listed within reach of a row, or a row's own copy. Along an axis that ``wrap``s, the
    frame is the box and its cells tile it: a whole number of them, a little wider."""
    budget = min(2**30, table * n_nodes)

    def grid_of(side, fine):  # (sides, cells per axis)
        widths = (min(side, widest[0]), min(side, widest[1]), min(side / fine, widest[2]))
        counts = [
            max(1, math.floor(e / s)) if w else math.ceil(e / s)
            for e, s, w in zip(extent, widths, wrap, strict=True)
        ]
        sides = [e / n if w else s for e, s, n, w in zip(extent, widths, counts, wrap, strict=True)]
        return tuple(sides), tuple(counts)

    def sides_of(side, fine):
        return grid_of(side, fine)[0]

    def size(side, fine):  # table entries
        return math.prod(n + 2 for n in grid_of(side, fine)[1])

    side = radius
    while size(side, 2) > budget and sides_of(side, 2) != sides_of(side * 1.25, 2):
        side *= 1.25
    fine = 16
    while fine > 2 and size(side, fine) > budget:
        fine //= 2
    sides, counts = grid_of(side, fine)
    if min(sides) <= 0 or size(side, fine) > 2**30:  # boxes over 10^5 times longer than wide
        raise ValueError(
            f"kNN: no cells fit a frame of {extent} Mpc/h for a ball of {radius:.4g} Mpc/h "
            f"(the box is too elongated); sides up to {widest} Mpc/h"
        )
    return sides, counts


def widest(cfg, radius, wrap=(False, False, False)):
    """[Mpc/h] (3,) the widest cells of a grid whose passes reach ``radius``: less than the box
    minus twice the ball. A row lists the nodes less than ball + side away in the frame along
    each axis; a particle's two copies a box L apart both lie there only if L < 2 (ball +
    side), and then the nearer is at least L - ball - side away in the box, within the ball
    only if side >= L - 2 ball (the row's own copy: side > L - ball). Along an axis that
    wraps there are no copies: any width."""
    ball = margin(cfg, radius)
    return [
        math.inf if w else 0.99 * (size - 2 * ball)
        for size, w in zip(cfg.box_size, wrap, strict=True)
    ]


def wraps(cfg, radii):
    """(3,) bools: whether the grid of passes ``radii`` wraps its cells around the box along
    x and y (never z), rather than taking ghosts there: along an axis of one device where
    the box is at least 2 balls and 3 cells wide, so that the 2 s + 1 columns a row lists
    along it (:func:`distpm.analysis.links.ball_columns`) are distinct. On one device the
    kNN then needs ghosts along z only, and fewer nodes in every grid.

    Decided with a table of ``TABLE`` entries per slot of the capacity: the grid's node
    buffers hold at least that, so its table's cells are no wider, which keeps the sides
    within the condition (their whole number along the box only grows)."""
    ball, dec = margin(cfg, radii[-1]), Decomposition.of(cfg)
    wrap = [p == 1 for p in dec.grid] + [False]
    while True:
        extent = [
            w if wraps else w + 2 * ball
            for w, wraps in zip(links.block_widths(cfg), wrap, strict=True)
        ]
        sides, _ = cells(
            extent, margin(cfg, radii[0]), dec.capacity, widest(cfg, radii[-1], wrap), wrap
        )
        fits = [size >= 2 * ball + 3 * s for size, s in zip(cfg.box_size, sides, strict=True)]
        if all(f or not w for f, w in zip(fits, wrap, strict=True)):
            return tuple(wrap)
        wrap = [w and f for w, f in zip(wrap, fits, strict=True)]


def ghost_sizes(cfg, radius, ghost_factor, wrap=(False, False, False)):
    """Ghost slots per face of each axis' pass for a ghost layer ``radius`` wide:
    ``ghost_factor`` times the nodes the layer would hold if the particles were uniform, the
    capacity times ``radius`` over the block's width, times the widening of the face by the
    previous passes' ghosts (1 + 2 radius / width for each).

    The default 2 leaves room on the grids measured (``benchmarks/halos.md``); where it
    does not, the error says which factor does. 0 along an axis that ``wrap``s
    (:func:`wraps`)."""
    capacity = Decomposition.of(cfg).capacity
    sizes, nodes, widening = [], capacity, 1.0
    for width, wraps in zip(links.block_widths(cfg), wrap, strict=True):
        if wraps:
            sizes.append(0)
            continue
        uniform = capacity * radius / width * widening
        sizes.append(min(nodes, max(64, math.ceil(ghost_factor * uniform))))
        nodes += 2 * sizes[-1]
        widening *= 1 + 2 * radius / width
    return sizes


def ghost_factor_for(cfg, ghost_radii, needed, ghost_factor, wraps=None):
    """The smallest ghost_factor (to 0.01, at least ``ghost_factor``) whose ghost slots hold
    ``needed`` (grids, 3) nodes per face, for grids of ghost layers ``ghost_radii`` wide
    (that wrap along the axes of ``wraps``, one per grid; default none)."""
    wraps = wraps or [(False, False, False)] * len(ghost_radii)

    def enough(factor):
        return all(
            (np.asarray(ghost_sizes(cfg, r, factor, w)) >= n).all()
            for r, n, w in zip(ghost_radii, needed, wraps, strict=True)
        )

    low, high = math.floor(ghost_factor * 100), math.ceil(ghost_factor * 200)  # in 1/100
    while not enough(high / 100):  # the sizes grow with the factor up to every node
        if high > 2**40:  # a face sends at most the nodes before its pass: never reached
            raise RuntimeError(f"kNN: no ghost_factor holds {needed.tolist()}")
        low, high = high, 2 * high
    while high - low > 1:  # low / 100 is too small, high / 100 enough
        middle = (low + high) // 2
        low, high = (low, middle) if enough(middle / 100) else (middle, high)
    return high / 100


def margin(cfg, radius):
    return radius * (1 + 1e-4) + 16 * float(np.finfo(np.float32).eps) * max(cfg.box_size)
