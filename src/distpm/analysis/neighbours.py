"""Exact k nearest neighbours of every particle, on any device grid.

Passes of growing radius r_j = r_0 2^(j/2). In a pass every particle still
unanswered looks at all particles (and ghosts, :mod:`distpm.parallel.ghosts`)
in the 27 cells of side >= r_j around it and keeps the k nearest; its answer
is exact once the k-th distance is <= r_j, since every particle within r_j
was looked at. Particles in dense regions are answered in the first passes,
where the cells are small, so they look at few candidates; those in voids in
later ones. r_0 is 1/8 of the radius that holds k particles on average; the
last radius is ``max_radius`` (at most half a block's width, the reach of
the ghosts). A particle still
unanswered then raises an error: no answer is ever approximate.

Candidates are enumerated a chunk at a time; the k nearest of each particle
are merged chunk by chunk (k rounds of a segment minimum, then a top-k with
what earlier chunks gave). Distances are periodic minimum images of the
global positions. The neighbours are integers (ids); the distances are
differentiable functions of the positions through the chosen pairs.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from distpm.analysis import links
from distpm.io import shares
from distpm.parallel import ghosts
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel.layout import Layout
from distpm.parallel.migrate import CapacityError
from distpm.parallel.runtime import to_host
from distpm.simulation import PARTICLES, SLOTS, mesh_layout, sharded
from distpm.state import Particles, linear_ids, wrap

_CHUNK = 1 << 18


def radii(cfg, k: int, max_radius: float | None) -> tuple[float, ...]:
    """[Mpc/h] the passes' radii: from 1/8 of the mean k-th neighbour distance t (dense
    regions) up to ``max_radius`` (default 8 t), growing by sqrt(2) (twice the volume)."""
    density = cfg.n_particles / math.prod(cfg.box_size)
    typical = (k / (4 / 3 * math.pi * density)) ** (1 / 3)
    reach = [w / 2 for w, p in zip(links.block_widths(cfg), cfg.device_grid, strict=False) if p > 1]
    top = min([*reach, min(cfg.box_size) / 4, max_radius or 8 * typical])
    out = [min(top, typical / 8)]
    while out[-1] < top:
        out.append(min(top, out[-1] * math.sqrt(2)))
    return tuple(out)


def _merge(best_d2, best_id, d2, ident, seg, n_seg: int, k: int):
    """The k smallest (d2, id) of each segment of a chunk, merged into the rows' bests.

    best_d2 (n_seg, k), best_id (n_seg, k, 2); d2 (chunk,), ident (chunk, 2),
    seg (chunk,) the chunk-local segment of each candidate.
    """
    taken = []
    slot = jnp.arange(d2.shape[0], dtype=jnp.int32)
    for _ in range(k):  # k rounds: the smallest remaining of each segment
        low = jax.ops.segment_min(d2, seg, n_seg)
        first = jax.ops.segment_min(jnp.where(d2 == low[seg], slot, d2.shape[0]), seg, n_seg)
        found = jnp.take(ident, first, axis=0, mode="fill", fill_value=-1)
        taken.append((low, jnp.where(jnp.isfinite(low)[:, None], found, -1)))
        d2 = d2.at[first].set(jnp.inf, mode="drop")
    new_d2 = jnp.stack([t[0] for t in taken], axis=1)
    new_id = jnp.stack([t[1] for t in taken], axis=1)
    all_d2 = jnp.concatenate([best_d2, new_d2], axis=1)
    all_id = jnp.concatenate([best_id, new_id], axis=1)
    neg, index = lax.top_k(-all_d2, k)
    return -neg, jnp.take_along_axis(all_id, index[:, :, None], axis=1)


def _ghost_sizes(cfg, radius, ghost_factor):
    """Ghost slots per face of each axis' pass for a ghost layer ``radius`` wide."""
    sizes, nodes = [], cfg.capacity
    for width in links.block_widths(cfg):
        size = min(nodes, max(64, math.ceil(ghost_factor * cfg.capacity * radius / width)))
        sizes.append(size)
        nodes += 2 * size
    return sizes


def _margin(cfg, radius):
    return radius * (1 + 1e-4) + 16 * float(np.finfo(np.float32).eps) * max(cfg.box_size)


def _pass(state, pos, ids, mask, radius, cfg, k, ghost_factor):
    """One pass of radius ``radius`` for the rows not yet answered; returns the new state."""
    best_d2, best_id, done, need = state
    layout = mesh_layout(cfg)
    cap = mask.shape[0]
    margin = _margin(cfg, radius)
    widths, to_frame = links.frame(cfg, layout, margin)
    sizes = _ghost_sizes(cfg, radius, ghost_factor)
    sources, rel, valid, _, needed = ghosts.plan(
        to_frame(pos), mask, widths, margin, cfg.device_grid, sizes
    )
    need = jnp.maximum(need, jnp.max(needed / jnp.asarray(sizes, jnp.float32)))
    node_pos = ghosts.fetch(sources, pos, cfg.device_grid)
    node_ids = ghosts.fetch(sources, ids, cfg.device_grid)
    extent = [w + 2 * margin for w in widths]
    side, n_cells = links.cell_grid(extent, margin)
    order, cells = links.sort_by_cell(rel, valid, side, n_cells)
    valid_s = valid[order]
    n_nodes = valid.shape[0]
    rank = jnp.zeros(n_nodes, jnp.int32).at[order].set(jnp.arange(n_nodes, dtype=jnp.int32))
    column, first, counts = links.column_table(cells, valid_s, n_cells)
    asking = mask & ~done
    starts, lengths = links.neighbour_ranges(
        cells, column, first, counts, rank[:cap], asking, n_cells
    )
    cand = links.Candidates(starts, lengths, min(_CHUNK, max(4096, cap)))
    pos_s, ids_s = node_pos[order], node_ids[order]
    box = jnp.asarray(cfg.box_size, pos.dtype)
    best_d2 = jnp.where(asking[:, None], jnp.inf, best_d2)  # this pass answers afresh

    def body(carry):
        c, best_d2, best_id = carry
        row, partner, ok = cand.chunk_at(c)
        partner_id = jnp.take(ids_s, partner, axis=0, mode="clip")
        d2 = links.periodic_d2(pos[row], jnp.take(pos_s, partner, axis=0, mode="clip"), box)
        ok = ok & jnp.any(partner_id != ids[row], axis=1)  # not itself (nor its image)
        d2 = jnp.where(ok, d2, jnp.inf)
        # chunk-local segments: one per row present in the chunk
        new = jnp.concatenate([jnp.ones(1, bool), row[1:] != row[:-1]])
        seg = jnp.cumsum(new) - 1
        n_seg = row.shape[0]
        head = jnp.full(n_seg, cap, jnp.int32).at[jnp.where(new, seg, n_seg)].set(row, mode="drop")
        rows_d2 = jnp.take(best_d2, head, axis=0, mode="fill", fill_value=jnp.inf)
        rows_id = jnp.take(best_id, head, axis=0, mode="fill", fill_value=-1)
        rows_d2, rows_id = _merge(rows_d2, rows_id, d2, partner_id, seg, n_seg, k)
        best_d2 = best_d2.at[head].set(rows_d2, mode="drop")
        best_id = best_id.at[head].set(rows_id, mode="drop")
        return c + 1, best_d2, best_id

    start = (jnp.zeros((), jnp.int32), best_d2, best_id)
    _, best_d2, best_id = lax.while_loop(lambda s: s[0] < cand.n_chunks(), body, start)
    done = done | (mask & (best_d2[:, k - 1] <= radius**2))
    return best_d2, best_id, done, need


def _by_dtype(leaves):
    """Split arrays into floats and int32s (bools and ints as int32) for migration."""
    floats = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    ints = [x.astype(jnp.int32) for x in leaves if not jnp.issubdtype(x.dtype, jnp.floating)]
    return floats, ints


def _restore(leaves, floats, ints):
    floats, ints = iter(floats), iter(ints)
    out = []
    for x in leaves:
        y = next(floats) if jnp.issubdtype(x.dtype, jnp.floating) else next(ints).astype(x.dtype)
        out.append(y)
    return out


@functools.partial(jax.jit, static_argnames=("cfg", "k", "radii", "reduce", "ghost_factor"))
def _knn(particles, cfg, k, radii, reduce, ghost_factor):
    def local(particles):
        layout = mesh_layout(cfg)
        pos = wrap(particles.pos, cfg.box_size)
        home = parallel_migrate.home_slots(layout, cfg.capacity)
        (pos,), (ids, home), mask, moved = parallel_migrate.by_position(
            [pos], [particles.ids, home], particles.mask, 0, layout, cfg.cell_size,
            cfg.exchange_size,
        )  # fmt: skip
        cap = mask.shape[0]
        best_d2 = Layout.varying(jnp.full((cap, k), jnp.inf, pos.dtype))
        best_id = Layout.varying(jnp.full((cap, k, 2), -1, jnp.int32))
        state = (best_d2, best_id, ~mask, Layout.varying(jnp.zeros((), jnp.float32)))
        for radius in radii:  # skip a pass once every particle everywhere has its answer
            left = layout.device_max(jnp.any(~state[2]).astype(jnp.int32)) > 0
            run = functools.partial(
                _pass, pos=pos, ids=ids, mask=mask, radius=radius, cfg=cfg, k=k,
                ghost_factor=ghost_factor,
            )  # fmt: skip
            state = lax.cond(left, run, lambda s: s, state)
        best_d2, best_id, done, need = state
        unanswered = jnp.sum(mask & ~done, dtype=jnp.int32)
        out = (jnp.sqrt(best_d2), best_id)
        if reduce is not None:
            out = reduce(*out)
        leaves, tree = jax.tree.flatten(out)
        floats, ints = _by_dtype(leaves)
        floats, ints, _, back = parallel_migrate.by_slot(
            floats, ints, mask, home, layout, cfg.exchange_size
        )
        out = jax.tree.unflatten(tree, _restore(leaves, floats, ints))
        status = jnp.stack([unanswered.astype(jnp.float32), need])
        return out, layout.device_max(status), layout.device_max(jnp.maximum(moved, back))

    return sharded(local, cfg, (PARTICLES,), (SLOTS, P(), P()))(particles)


def knn(particles, k, cfg, reduce=None, *, max_radius=None, ghost_factor=4.0):
    """The k nearest other particles of every particle: distances and ids, exact.

    particles: :class:`distpm.Particles` on ``cfg``'s grid, or positions
    (N, 3) [Mpc/h] of ``cfg.n_particles`` points in any order. Returns, for
    Particles, (distances (slots, k) [Mpc/h] ascending, ids (slots, k, 2)
    int32 id words), sharded like the particles (empty slots: inf and -1);
    for positions, numpy (N, k) distances and (N, k) int64 row indices, in
    the input order. Distances are periodic. Ties at equal distance may list
    either particle.

    reduce: a function of (distances (n, k), ids (n, k, 2)) returning arrays
    (n, ...) (or a pytree of them), applied on each device where the
    neighbours are found, so full neighbour lists never travel: its result
    replaces (distances, ids), for Particles and positions alike (e.g. a kNN
    density k / (4/3 pi d_k^3)). It must be a hashable function of jax arrays.

    max_radius [Mpc/h]: the largest search radius (default 8 times the mean
    k-th neighbour distance; at most half a block's width and a quarter of
    the box). A particle whose k-th neighbour is farther raises a
    ValueError. ghost_factor: ghost slots per face, as in :func:`distpm.fof`.
    """
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if k >= cfg.n_particles:
        raise ValueError(f"k = {k} needs more than {cfg.n_particles} particles")
    if not isinstance(particles, Particles):
        return _knn_rows(particles, k, cfg, reduce, max_radius, ghost_factor)
    steps = radii(cfg, k, max_radius)
    out, status, moved = _knn(particles, cfg, k, steps, reduce, ghost_factor)
    parallel_migrate.check(moved, cfg)
    unanswered, need = (float(x) for x in jax.device_get(status))
    if need > 1:
        raise CapacityError(
            f"kNN ghost overflow (ghost_factor={ghost_factor}); raise ghost_factor to at least "
            f"{math.ceil(need * ghost_factor * 100) / 100}"
        )
    if unanswered:
        raise ValueError(
            f"{int(unanswered)} particles have fewer than k = {k} neighbours within "
            f"{steps[-1]:.4g} Mpc/h, the largest search radius; raise max_radius (at most half "
            f"a block's width: use fewer devices along x or y for more)"
        )
    return out


def _knn_rows(pos, k, cfg, reduce, max_radius, ghost_factor):
    """:func:`knn` of an (N, 3) array: rows become particles whose ids are the row indices."""
    particles = shares.from_positions(pos, cfg)
    out = knn(particles, k, cfg, reduce, max_radius=max_radius, ghost_factor=ghost_factor)
    out = jax.tree.map(to_host, out)
    if reduce is None:
        dist, ids = out
        rows = np.where(ids[..., 0] >= 0, linear_ids(ids, cfg.particle_shape), 0)
        out = (dist, np.where(ids[..., 0] >= 0, rows.astype(np.int64), -1))
    return jax.tree.map(lambda x: shares.in_row_order(particles, x, cfg), out)
