"""Exact k nearest neighbours of every particle, on any device grid.

First, every particle gets an upper bound b on its k-th neighbour distance,
from the particles near it in Morton order (:mod:`distpm.analysis.bounds`;
no communication). Then passes of growing radius r_j = r_0 2^j: a particle
looks in the first pass whose radius reaches its bound, at all particles
(and ghosts, :mod:`distpm.parallel.ghosts`) within b of it, and keeps the k
nearest; its answer is exact, since the ball of b holds at least k and
every particle in it was looked at. Most particles are thus looked up
once, in a ball about 1.2 times the volume of its k-th neighbour's on
average, where passes that every unanswered particle joined looked at
each candidate twice (a first count, to choose how far to keep them).

r_0 is 1/4 of the radius that holds k particles on average; the last
radius is ``max_radius`` (at most half a block's width, the reach of the
ghosts), where every particle still unanswered looks within it. One still
unanswered then raises an error: no answer is ever approximate. Without a
bound (inf: k > 20, or fewer than k particles near it in Morton order) a
particle asks in every pass, within r_j, until it has k there.

Grids of cells serve two passes each (r_j and 2 r_j; three where cells
wrap), the last radius one of its own (its ghosts are the widest): a grid's
ghosts, sort and cell table cost as much however few particles ask, and a
grid is skipped when nobody does (the grids are planned in
:mod:`distpm.analysis.knn_cells`). In the last pass of the grid before each
of the wide ones, the particles whose bound lies within the wide grid's
radius look too, within r_j: those whose k nearest lie there are answered
(a bound is often loose), and the wide grid, with its coarse cells, may
not be needed (:func:`_beyond`). A pass takes the rows asking in the order
of their cells, a block of about ``_RANGES`` column ranges (or about two
per slot of the device, at least 1024 rows) at a time, and merges their
candidates into arrays of the block, so that the lookups of neighbouring
rows fall near each other in memory.

Along x and y, on an axis of one device, a grid's cells wrap around the box
(:func:`distpm.analysis.knn_cells.wraps`): its frame is the box there, the
columns past one face are those at the other, and it takes no ghosts along
it (z always has them). The wide radius 4 t then joins the pair before it,
which saves sorting every node again for a grid of its own.

The candidates within b of a particle are found in the 9 columns (x, y) of
side >= r_j around it (25 of side >= r_j / 2 in a grid's second pass), each
trimmed to the z cells (up to 16 times finer) that its ball reaches
(:func:`distpm.analysis.links.ball_columns`): for b = r_j, 13-16.5 b^3
instead of the 27 b^3 of the cells around it. The cells' first nodes are in
a dense table of at most ``distpm.analysis.knn_cells.TABLE`` int32 per node
(columns are widened until it fits, but never to the box minus twice the
ball, where a particle's two copies in the frame would both be in reach)
rather than found by bisections, which cost a large part of a pass. A
particle is told from its candidates by its node.

Candidates are enumerated a chunk at a time
(:class:`distpm.analysis.links.Candidates`); those within the row's own
reach (b, or r_j for a row looking beyond its bound) are compacted and
merged into the rows' k nearest 1/16 of a chunk at a time (a merge costs
in proportion to its slice, full or not), each ranked within its row by
comparisons with its neighbours in the list when no row has more than 32
of them, else by one sort by (run of the row, distance):
:func:`distpm.ops.sorting.argsort` in one pass, as the run numbers need no
more bits than the slice's length. Distances are periodic minimum images of
the global positions. The neighbours are integers (ids); the distances are
differentiable functions of the positions through the chosen pairs.
Measured costs of these choices: ``benchmarks/halos.md`` (kNN).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import PartitionSpec as P

from distpm import shares
from distpm.analysis import bounds, knn_answers, knn_cells, links
from distpm.ops import compact, running_max, running_sum, sorting
from distpm.parallel import ghosts, overflow
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel.decomposition import SLOTS, Decomposition
from distpm.parallel.layout import Layout
from distpm.parallel.overflow import Limit
from distpm.parallel.runtime import to_host
from distpm.state import PARTICLES, Particles, linear_ids, wrap

# Working sets in proportion to the device's slots where these would be larger, so that its
# memory falls with its share of the particles
_CHUNK = 1 << 18  # candidates looked at a time (or a quarter of the slots, at least 4096)
_KEPT = 16  # kept candidates are merged a chunk / _KEPT at a time
_RANGES = 1 << 22  # column ranges listed at a time (rows of a block x their columns; or 2 per slot)


def _beyond(group, later):
    """The largest bound of the rows that look in the last pass of a grid of radii ``group``
    (within its last radius), when the grid of radii ``later`` comes next.

    If that grid is one of the wide ones at the end (one pass each, coarse cells, few rows),
    its first radius: of the 23 000 rows of 128^3 PM particles bounded within (2 t, 4 t],
    20 000 found their k within 2 t, in the finer cells; where all do, the wide grid does not
    run. Else the grid's own last radius: a pair of passes follows, which runs anyway for the
    many rows bounded within it. Of the 640 000 PM particles bounded within (t / 2, t], 4%
    found their k within t / 2 in the grid before; the others' looks cost 9e6 candidates and
    5e6 column ranges (8% and 15% of the kNN's)."""
    return later[0] if len(later) == 1 else group[-1]


def _merge(best_d2, best_id, row, d2, ident, k: int):
    """Merge candidates into the k nearest of their rows.

    best_d2 (cap + 1, k), best_id (cap + 1, k, 2): the rows' k nearest so
    far, inf and -1 where none, and a spare last row that takes the
    candidates not kept (scattered there rather than out of range, which
    XLA's CPU scatter runs 2 times slower); row (m,) the row of each
    candidate, non-decreasing, ``cap`` for unused entries; d2 (m,) and
    ident (m, 2) its squared distance and id. A row's candidates come in
    one run, so only the first row can have some from before: its k nearest
    so far join the run. Each candidate is ranked by d2 within its row's run
    (by comparisons with its neighbours when runs are short, else by one
    sort by (row, d2)); the k first are the row's k nearest.
    """
    cap = best_d2.shape[0] - 1  # the spare row
    head = jnp.minimum(row[0], cap - 1)
    before = jnp.where(row[0] < cap, best_d2[head], jnp.inf)
    row = jnp.concatenate([jnp.full(k, row[0], row.dtype), row])
    d2 = jnp.concatenate([before, d2])
    ident = jnp.concatenate([best_id[head], ident])
    m = row.shape[0]
    index = jnp.arange(m, dtype=jnp.int32)
    new = jnp.concatenate([jnp.ones(1, bool), row[1:] != row[:-1]])
    run = index - running_max(jnp.where(new, index, 0))  # place in the row's run
    longest = jnp.max(jnp.where(row < cap, run, 0)) + 1
    window = 32  # runs up to this long are ranked in place, longer ones sorted

    def by_sort():  # rows are non-decreasing: they stay in place, each run sorted by d2
        if d2.dtype == jnp.float32:  # by (which run, d2): one sort pass
            group = (running_sum(new) - 1).astype(jnp.uint32)
            order = sorting.argsort(group, d2, high_bits=(m - 1).bit_length())
        else:  # float64 runs: a sort with the index riding along
            order = lax.sort((row, d2, index), num_keys=2)[2]
        return d2[order], ident[order], run

    in_place = lambda: (d2, ident, _run_ranks(row, d2, window))  # noqa: E731
    d2, ident, rank = lax.cond(longest > window, by_sort, in_place)
    keep = (rank < k) & (row < cap)  # the k nearest of each row
    at = (jnp.where(keep, row, cap), jnp.where(keep, rank, 0))
    return best_d2.at[at].set(d2), best_id.at[at].set(ident)  # in range: the spare row


def _run_ranks(row, d2, window: int):
    """Each entry's rank by (d2, position) within its run of equal ``row``, for runs of at most
    ``window`` entries: it is compared with the ``window`` - 1 entries on each side (no sort)."""
    m = row.shape[0]
    rows = jnp.pad(row, window, constant_values=-1)
    dist = jnp.pad(d2, window, constant_values=jnp.inf)
    shifted = lambda o: (rows[window + o : window + o + m], dist[window + o : window + o + m])  # noqa: E731
    rank = jnp.zeros(m, jnp.int32)
    for o in range(1, window):
        (r_before, d_before), (r_after, d_after) = shifted(-o), shifted(o)
        rank += ((r_before == row) & (d_before <= d2)).astype(jnp.int32)
        rank += ((r_after == row) & (d_after < d2)).astype(jnp.int32)
    return rank


def _grid(state, pos, ids, vel, mask, bound2, radii, beyond, cfg, k, reduce, ghost_factor, index):
    """Passes of radii ``radii`` (growing, the last at most 4 times the first) on one grid of
    cells for the rows not yet answered; returns the new state. The ghosts, the sort and the
    cell table serve all of them. A row asks, until it is answered, in every pass whose
    radius reaches its squared bound ``bound2`` (every pass where that is inf), and in the
    last pass if its bound is within ``beyond`` (:func:`_beyond`; inf for the last grid).
    The nodes each face had to send go to row ``index`` of the state's ``need``."""
    dec = Decomposition.of(cfg)
    answers, done, need, most = state
    layout = dec.mesh
    cap = mask.shape[0]
    wrap = knn_cells.wraps(cfg, radii)
    # no ghosts where it wraps
    margins = [0.0 if w else knn_cells.margin(cfg, radii[-1]) for w in wrap]
    widths, to_frame = links.frame(cfg, layout, margins)
    sizes = knn_cells.ghost_sizes(cfg, radii[-1], ghost_factor, wrap)
    sources, rel, valid, _, needed = ghosts.plan(
        to_frame(pos), mask, widths, margins, dec.grid, sizes
    )
    need = need.at[index].set(needed)
    node_pos = ghosts.fetch(sources, pos, dec.grid)
    node_ids = ghosts.fetch(sources, ids, dec.grid)
    extent = [w + 2 * m for w, m in zip(widths, margins, strict=True)]
    n_nodes = valid.shape[0]
    widest = knn_cells.widest(cfg, radii[-1], wrap)
    sides, n_cells = knn_cells.cells(extent, knn_cells.margin(cfg, radii[0]), n_nodes, widest, wrap)
    order, cells = links.sort_by_cell(rel, valid, sides, n_cells)
    rank = jnp.zeros(n_nodes, jnp.int32).at[order].set(jnp.arange(n_nodes, dtype=jnp.int32))
    node_vel = None if reduce is None else ghosts.fetch(sources, vel, dec.grid)[order]
    nodes = _Nodes(
        table=links.cell_starts(cells, valid[order], n_cells),
        pos=links.columns(node_pos[order]),
        ids=links.columns(node_ids[order]),
        vel=None if reduce is None else links.columns(node_vel),
        rel=rel[:cap],
        cells=cells[rank[:cap]],
        node_of=rank[:cap],
        slot_of=order,
        sides=sides,
        n_cells=n_cells,
        wrap=wrap[:2],
    )
    no_bound = jnp.isinf(bound2)
    for radius, limit in zip(radii, (*radii[:-1], beyond), strict=True):
        r2 = jnp.asarray(radius, pos.dtype) ** 2
        asking = mask & ~done & ((bound2 <= jnp.asarray(limit, pos.dtype) ** 2) | no_bound)
        # a little beyond the bound: d2 rounds alike here and there only up to fused multiply-adds
        own = jnp.minimum(bound2, r2) * (1 + 2.0**-20)
        answers, most = _answer(answers, asking, own, most, nodes, pos, radius, cfg, k, reduce)
        # k found within its own reach, where it looked at every particle: its k nearest
        done = done | (mask & knn_answers.answered(answers, k, reduce))
    return answers, done, need, most


class _Nodes(NamedTuple):
    """A grid's sorted nodes: cell table, global positions, ids and (for a reduction)
    velocities (columns), and the frame coordinates and cells of the device's own particles
    (in slot order)."""

    table: jax.Array
    pos: tuple
    ids: tuple
    vel: tuple | None
    rel: jax.Array
    cells: jax.Array
    node_of: jax.Array  # each own particle's sorted node
    slot_of: jax.Array  # each sorted node's slot (>= cap: a ghost)
    sides: tuple
    n_cells: tuple
    wrap: tuple  # (x, y): the cells wrap around the box (:func:`distpm.analysis.knn_cells.wraps`)


def _answer(answers, asking, own, most, nodes, pos, radius, cfg, k, reduce):
    """The k nearest of the ``asking`` rows within their own squared reach ``own`` (at most
    ``radius``), for those that have k there, a block of rows at a time; the others keep
    those they found, inf where fewer than k."""
    cap = asking.shape[0]
    ball = knn_cells.margin(cfg, radius)
    n_columns = (2 * links.column_reach(ball, nodes.sides) + 1) ** 2
    block = min(cap, max(1024, min(_RANGES, 2 * cap) // n_columns))
    answers = knn_answers.fresh(answers, asking, reduce)  # this pass answers afresh
    rows, n_rows = _in_cell_order(asking, nodes.slot_of, block)

    def one(state):
        b, answers, most = state
        mine = lax.dynamic_slice_in_dim(rows, b * block, block)
        answers, examined = _block(answers, mine, own, nodes, pos, radius, ball, cfg, k, reduce)
        return b + 1, answers, jnp.maximum(most, examined)

    n_blocks = (n_rows + block - 1) // block
    state = (jnp.zeros((), jnp.int32), answers, most)
    _, answers, most = lax.while_loop(lambda s: s[0] < n_blocks, one, state)
    return answers, most


def _in_cell_order(asking, slot_of, block):
    """The slots of the ``asking`` rows in the order of their cells (so that neighbouring rows'
    lookups fall near each other in memory), padded with ``cap`` to whole blocks, and their
    number."""
    cap = asking.shape[0]
    wanted = (slot_of < cap) & asking[jnp.minimum(slot_of, cap - 1)]
    at, n_rows = compact(wanted, cap)
    rows = jnp.take(slot_of, at, mode="fill", fill_value=cap)
    return jnp.pad(rows, (0, -cap % block), constant_values=cap), n_rows


def _block(answers, rows, own, nodes, pos, radius, ball, cfg, k, reduce):
    """:func:`_answer` for the rows ``rows`` (block,) (``cap`` past the last): their k
    nearest are merged into arrays of the block, then written to theirs."""
    cap = own.shape[0]
    active = rows < cap
    at = jnp.minimum(rows, cap - 1)
    own_reach = own[at]
    columns = links.ball_columns(
        nodes.rel[at], nodes.cells[at], nodes.sides, ball, nodes.n_cells,
        jnp.minimum(jnp.sqrt(own_reach) * (1 + 1e-4) + (ball - radius), ball), nodes.wrap,
    )  # fmt: skip
    starts, lengths = links.spans_from_table(nodes.table, columns, nodes.n_cells, active)
    cand = links.Candidates(starts, lengths, min(_CHUNK, max(4096, cap // 4)))
    own_pos, own_node = links.columns(pos[at]), nodes.node_of[at]
    box = cfg.box_size
    merged = max(1024, cand.chunk // _KEPT)

    def look(c):  # the chunk's candidates: row in the block, partner (sorted node), d2, whether one
        row, partner, ok = cand.chunk_at(c)
        d2 = links.periodic_d2(
            [x[row] for x in own_pos], [jnp.take(x, partner, mode="clip") for x in nodes.pos], box
        )
        # not itself (its copies in the frame are out of reach: knn_cells.widest)
        return row, partner, d2, ok & (partner != own_node[row])

    n = rows.shape[0]

    def body(carry):
        c, best_d2, best_id = carry
        row, partner, d2, ok = look(c)
        ok = ok & (d2 <= own_reach[row])
        m = ok.shape[0]
        source, kept = compact(ok, m, block=m)  # kept ones first, then m
        source = jnp.pad(source, (0, -m % merged), constant_values=m)  # whole slices

        def merge(state):  # the kept candidates, ``merged`` at a time, in their order
            j, best_d2, best_id = state
            src = lax.dynamic_slice_in_dim(source, j * merged, merged)
            node = jnp.take(partner, src, mode="clip")  # past the kept ones: never written
            ident = jnp.stack([node, jnp.zeros_like(node)], 1)  # the node: ids, vel at the end
            best_d2, best_id = _merge(
                best_d2, best_id, jnp.take(row, src, mode="fill", fill_value=n),
                jnp.take(d2, src, mode="fill", fill_value=jnp.inf), ident, k,
            )  # fmt: skip
            return j + 1, best_d2, best_id

        rounds = (kept + merged - 1) // merged
        _, best_d2, best_id = lax.while_loop(
            lambda s: s[0] < rounds, merge, (jnp.zeros((), jnp.int32), best_d2, best_id)
        )
        return c + 1, best_d2, best_id

    local_d2 = Layout.varying(jnp.full((n + 1, k), jnp.inf, pos.dtype))  # + _merge's spare
    local_id = Layout.varying(jnp.full((n + 1, k, 2), -1, jnp.int32))
    start = (jnp.zeros((), jnp.int32), local_d2, local_id)
    _, local_d2, local_id = lax.while_loop(lambda s: s[0] < cand.n_chunks(), body, start)
    answers = knn_answers.write(
        answers, rows, local_d2[:n], local_id[:n, :, 0], nodes.ids, nodes.vel, k, reduce
    )
    return answers, cand.examined


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
    dec = Decomposition.of(cfg)

    def local(particles):
        layout = dec.mesh
        pos = wrap(particles.pos, cfg.box_size)
        home = parallel_migrate.home_slots(layout, dec.capacity)
        floats = [pos] if reduce is None else [pos, particles.vel]  # a reduction's velocities
        floats, (ids, home), mask, moved = parallel_migrate.by_position(
            floats, [particles.ids, home], particles.mask, 0, layout, cfg.cell_size,
            dec.exchange_size,
        )  # fmt: skip
        pos, vel = floats[0], floats[-1]
        cap = mask.shape[0]
        answers = knn_answers.empty(cap, k, pos.dtype, reduce)
        groups = knn_cells.groups(radii, cfg)
        need = Layout.varying(jnp.zeros((len(groups), 3), jnp.int32))  # int32: exact counts
        state = (answers, ~mask, need, Layout.varying(jnp.zeros((), jnp.float32)))
        bound2 = bounds.kth_bound2(pos, mask, cfg.box_size, k)
        afters = [_beyond(g, later) for g, later in zip(groups, groups[1:], strict=False)]
        afters.append(math.inf)
        for index, (group, after) in enumerate(zip(groups, afters, strict=True)):
            within = (bound2 <= jnp.asarray(after, pos.dtype) ** 2) | jnp.isinf(bound2)
            asking = ~state[1] & within
            left = layout.device_max(jnp.any(asking).astype(jnp.int32)) > 0
            run = functools.partial(
                _grid, pos=pos, ids=ids, vel=vel, mask=mask, bound2=bound2, radii=group,
                beyond=after, cfg=cfg, k=k, reduce=reduce, ghost_factor=ghost_factor, index=index,
            )  # fmt: skip
            state = lax.cond(left, run, lambda s: s, state)
        answers, done, need, most = state
        unanswered = jnp.sum(mask & ~done, dtype=jnp.int32)
        out = (jnp.sqrt(answers[0]), answers[1]) if reduce is None else answers[0]
        leaves, tree = jax.tree.flatten(out)
        floats, ints = _by_dtype(leaves)
        floats, ints, _, back = parallel_migrate.by_slot(
            floats, ints, mask, home, layout, dec.exchange_size
        )
        out = jax.tree.unflatten(tree, _restore(leaves, floats, ints))
        needs = {**overflow.most(moved, back), "knn_ghosts": need, "knn_candidates": most}
        return out, layout.device_max(unanswered), layout.device_max(needs)

    return dec.sharded(local, (PARTICLES,), (SLOTS, P(), P()))(particles)


def knn(particles, k, cfg, *, reduce=None, max_radius=None, ghost_factor=2.0):
    """The k nearest other particles of every particle of a run: distances and ids, exact.

    particles: :class:`distpm.Particles` on ``cfg``'s grid (for an array of
    positions: :func:`knn_points`). Returns (distances (slots, k) [Mpc/h]
    ascending, ids (slots, k, 2) int32 id words), sharded like the particles
    (empty slots: inf and -1; :func:`distpm.linear_ids` turns the words into
    int64 Lagrangian indices). Distances are periodic. Ties at equal distance
    may list either particle.

    reduce: a function of (distances (m, k) [Mpc/h], ids (m, k, 2), velocities (m, k, 3))
    of the k nearest of m rows, returning arrays (m, ...) (or a pytree of them): it runs on
    each block of rows of a pass as their neighbours are found, so the (slots, k) lists
    never exist and never travel; its result replaces (distances, ids).
    :mod:`distpm.analysis.knn_answers` has three: ``kth_distance`` (a density estimate:
    (k - 1) / (4/3 pi d_k^3)), ``mean_distance`` and ``mean_velocity``. It must be a
    hashable function of jax arrays.

    max_radius [Mpc/h]: the largest search radius (default 8 times the mean
    k-th neighbour distance; at most half a block's width and a quarter of
    the box). A particle whose k-th neighbour is farther raises a
    ValueError. ghost_factor: ghost slots per face, in units of the capacity times the
    layer's width over the block's (the nodes it would hold if uniform particles filled
    every slot), counting the ghosts of earlier passes in the layer (:func:`distpm.fof`
    counts without them). Too few raises a CapacityError with the least value that holds
    what the faces sent (a lower bound: after an overflow, later passes send fewer).
    Not for use under ``jit``: it reads its buffers' needs on the host.
    """
    if not isinstance(particles, Particles):
        raise TypeError(
            f"knn takes distpm.Particles, got {type(particles).__name__}; for an (N, 3) array "
            f"of positions use distpm.knn_points"
        )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k must be an integer >= 1, got {k!r}")
    if k >= cfg.n_particles:
        raise ValueError(f"k = {k} needs more than {cfg.n_particles} particles")
    if not 0 < ghost_factor < math.inf:
        raise ValueError(f"ghost_factor must be > 0, got {ghost_factor!r}")
    steps = knn_cells.radii(cfg, k, max_radius)
    out, unanswered, needs = _knn(particles, cfg, k, steps, reduce, ghost_factor)
    overflow.check(needs, parallel_migrate.limits(cfg) | _limits(cfg, steps, ghost_factor))
    unanswered = int(jax.device_get(unanswered))
    if unanswered:
        raise ValueError(
            f"{int(unanswered)} particles have fewer than k = {k} neighbours within "
            f"{steps[-1]:.4g} Mpc/h, the largest search radius; raise max_radius (at most half "
            f"a block's width: use fewer devices along x or y for more)"
        )
    return out


def knn_points(pos, k, cfg, *, reduce=None, max_radius=None, ghost_factor=2.0):
    """:func:`knn` of ``cfg.n_particles`` positions (N, 3) [Mpc/h] in any order.

    Returns numpy (N, k) distances [Mpc/h] and (N, k) int64 row indices, in
    the input order (or ``reduce``'s result, rows in the input order).
    """
    particles = shares.from_positions(pos, cfg)  # ids: the row indices
    out = knn(particles, k, cfg, reduce=reduce, max_radius=max_radius, ghost_factor=ghost_factor)
    out = jax.tree.map(to_host, out)
    if reduce is None:
        out = (out[0], linear_ids(out[1], cfg.particle_shape))
    return jax.tree.map(lambda x: shares.in_row_order(particles, x, cfg), out)


def _limits(cfg, radii, ghost_factor) -> dict:
    """The :class:`~distpm.parallel.overflow.Limit` of the kNN's own buffers."""
    groups = knn_cells.groups(radii, cfg)
    ghost_radii = [group[-1] for group in groups]
    wraps = [knn_cells.wraps(cfg, group) for group in groups]
    sizes = [
        tuple(knn_cells.ghost_sizes(cfg, r, ghost_factor, w))
        for r, w in zip(ghost_radii, wraps, strict=True)
    ]
    least = functools.partial(  # the sizes are not linear in the factor: search
        knn_cells.ghost_factor_for, cfg, ghost_radii, ghost_factor=ghost_factor, wraps=wraps
    )
    return {
        "knn_ghosts": Limit(  # (grids, 3) nodes sent across a face
            tuple(sizes),
            "kNN ghost overflow: a device sent {need} nodes across one face but has {have} slots",
            "ghost_factor",
            ghost_factor,
            least,
        ),
        "knn_candidates": Limit(  # int32 slot numbers of a block's candidates
            2.0**31 - 2 * _CHUNK,
            "kNN: a block of rows had {need:.3g} candidates on one device, more than int32 numbers",
            advice="use more devices",
        ),
    }
