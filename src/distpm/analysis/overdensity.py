"""Spherical-overdensity masses around given centres, counting every particle on any device.

For a threshold Delta (in units of the mean matter density), the particles around a
centre are taken in order of distance d_1 <= d_2 <= ...; the j-th *qualifies* when the
mean density of the j nearest within d_j reaches the threshold, j >= Delta n (4 pi / 3)
d_j^3, with n = N / V the mean number density. J is the outermost qualifying particle
within the centre's search radius, and

    M_Delta = J m_p,    R_Delta = (3 J / (4 pi Delta n))^(1/3),

the radius where the mean density of those J particles is exactly Delta times the mean
(d_J <= R_Delta < d_(J+1)). Radii are comoving [Mpc/h], masses [1e10 Msun/h]. Two
thresholds are used: 200 (``200m``) and 200 / Omega_m(a) (``200c``, 200 times the critical
density at the particles' a). No particle qualifying gives 0.

Where the outermost particle within the search radius qualifies, the sphere may reach
beyond it: :func:`spherical_overdensity` searches those centres again with twice the
radius, up to the ghosts' reach (half a block's width, a quarter of the box).

On each device (inside ``shard_map``): the centres in its block (sent by the host, where
every process holds them all: a catalogue is small), its particles and ghost copies of those
within the largest search radius of its faces (:mod:`distpm.parallel.ghosts`), sorted by
cell; each centre's candidates in the columns its ball reaches
(:func:`distpm.analysis.links.ball_columns`). Centres are taken in windows of whole centres
whose candidates number at most ``window`` slots (a quarter of the device's capacity, or the
most one centre has: the search then runs again with that): the candidates within each
centre's radius are kept, sorted by (centre, distance), and ranked. Distances are periodic
minimum images of the global positions: the same arithmetic on any device grid, so the same
centres give the same counts on every grid.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import PartitionSpec as P

from distpm import background
from distpm.analysis import knn_cells, links
from distpm.ops import compact, running_max, sorting
from distpm.parallel import ghosts, overflow, runtime
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel.decomposition import SLOTS, Decomposition
from distpm.parallel.layout import Layout
from distpm.parallel.overflow import Limit
from distpm.parallel.runtime import to_host
from distpm.state import PARTICLES, wrap
from distpm.units import particle_mass

DELTA = 200.0
_CHUNK = 1 << 16  # candidates looked at a time
_RANGES = 1 << 20  # column ranges of a block of centres, at most (or 64 centres)
_COLUMNS = 2  # columns on each side of a centre's own at most (cells >= the reach / 2)
# [Mpc/h] the search radius a plan allows for: twice R200m of 2e15 Msun/h at z = 0
PLANNED_RADIUS = 6.0
_GHOST_FACTOR = 2.0  # ghost slots at first, in units of the ghosts of uniform particles


def thresholds(cosmo, a) -> dict:
    """{name: Delta} in units of the mean matter density: 200m and 200c at ``a``."""
    omega = float(background.Omega_m_of_a(a, cosmo))
    return {"200m": DELTA, "200c": DELTA / omega}


def search_radius(n, cfg):
    """[Mpc/h] the catalogue's search radius for groups of n particles: twice the radius
    where n particles make ``DELTA`` times the mean density, at most :func:`reach`."""
    density = cfg.n_particles / math.prod(cfg.box_size)
    radius = 2 * np.cbrt(3 * np.asarray(n, np.float64) / (4 * math.pi * DELTA * density))
    return np.minimum(radius, reach(cfg))


def reach(cfg) -> float:
    """[Mpc/h] the largest search radius: half a split block's width, a quarter of the box."""
    grid = Decomposition.of(cfg).grid
    widths = links.block_widths(cfg)
    split = [w / 2 for w, p in zip(widths, grid, strict=False) if p > 1]
    return 0.99 * min([*split, min(cfg.box_size) / 4])


def _round_up(x: float, unit: float) -> float:
    """x rounded up to unit * 2^(k / 2): few distinct compiled sizes."""
    return unit * 2 ** (math.ceil(2 * math.log2(max(x, unit) / unit)) / 2)


@functools.partial(
    jax.jit, static_argnames=("cfg", "top", "side", "size", "window", "ghost_factor")
)
def _counts(particles, centres, radius, deltas, cfg, top, side, size, window, ghost_factor):
    """Per centre: J for each threshold (size, D) and the particles within its radius
    (size,), sharded as the centres (``size`` per device, in its block; radius 0 for none),
    and the buffers' needs. top [Mpc/h]: the largest radius; side [Mpc/h]: the cells'
    columns (at least); window: candidates sorted at a time."""
    dec = Decomposition.of(cfg)
    ball = knn_cells.margin(cfg, top)  # the ghosts' reach, with room for round-off
    n_deltas = deltas.shape[0]
    density = cfg.n_particles / math.prod(cfg.box_size)

    def local(particles, centre, r, deltas):
        layout = dec.mesh
        pos = wrap(particles.pos, cfg.box_size)
        (pos,), _, mask, moved = parallel_migrate.by_position(
            [pos], [], particles.mask, 0, layout, cfg.cell_size, dec.exchange_size
        )
        widths, to_frame = links.frame(cfg, layout, ball)
        sizes = knn_cells.ghost_sizes(cfg, ball, ghost_factor)
        sources, rel, valid, _, ghost_need = ghosts.plan(
            to_frame(pos), mask, widths, ball, dec.grid, sizes
        )
        extent = [w + 2 * ball for w in widths]
        widest = knn_cells.widest(cfg, ball)  # one int32 of cell table per node: few centres
        sides, n_cells = knn_cells.cells(extent, side, valid.shape[0], widest, table=1)
        order, cells = links.sort_by_cell(rel, valid, sides, n_cells)
        table = links.cell_starts(cells, valid[order], n_cells)
        xyz = [ghosts.fetch(sources, x, dec.grid)[order] for x in links.columns(pos)]

        # the centres a block at a time: their candidates' ranges in the columns their
        # balls reach, then windows of whole centres
        centre_rel = to_frame(centre)
        outside = (r > 0) & jnp.any((centre_rel < 0) | (centre_rel > jnp.asarray(extent)), 1)
        n_columns = (2 * links.column_reach(ball, sides) + 1) ** 2
        block = min(size, max(64, 1 << ((_RANGES // n_columns).bit_length() - 1)))

        def candidates(centre, r):  # of a block of centres, and each one's last slot + 1
            centre_rel = to_frame(centre)
            last_cell = jnp.asarray(n_cells, jnp.int32) - 1
            cell = jnp.clip(jnp.floor(centre_rel / jnp.asarray(sides, pos.dtype)), 0, last_cell)
            within = jnp.minimum(r * (1 + 1e-4) + (ball - top), ball)
            columns = links.ball_columns(
                centre_rel, cell.astype(jnp.int32) + 1, sides, ball, n_cells, within
            )
            starts, lengths = links.spans_from_table(table, columns, n_cells, r > 0)
            cand = links.Candidates(starts, lengths, min(_CHUNK, window))
            return cand, jnp.sum(lengths, axis=1), jnp.cumsum(jnp.sum(lengths, axis=1))

        def look(cand, centre, r, s, end, buffer):  # slots [s, s + chunk), kept if within r
            row, partner, ok = cand.slots_from(s)
            d2 = links.periodic_d2(
                [x[row] for x in links.columns(centre)],
                [jnp.take(x, partner, mode="clip") for x in xyz],
                cfg.box_size,
            )
            keep = ok & (s + jnp.arange(cand.chunk) < end) & (d2 <= r[row] * r[row])
            rows, dist, filled = buffer
            place, kept = compact(keep, cand.chunk)
            slots = filled + jnp.arange(cand.chunk, dtype=jnp.int32)
            slots = jnp.where(slots < filled + kept, slots, window)
            rows = rows.at[slots].set(jnp.take(row, place, mode="clip"), mode="drop")
            dist = dist.at[slots].set(jnp.take(d2, place, mode="clip"), mode="drop")
            return rows, dist, filled + kept

        def count(rows, dist, found, inside):  # J per centre of a window's sorted candidates
            order = sorting.argsort(rows.astype(jnp.uint32), dist, high_bits=block.bit_length())
            rows, dist = rows[order], dist[order]
            index = jnp.arange(window, dtype=jnp.int32)
            new = jnp.concatenate([jnp.ones(1, bool), rows[1:] != rows[:-1]])
            j = index - running_max(jnp.where(new, index, 0)) + 1  # rank within the centre
            volume = 4 * math.pi / 3 * dist * jnp.sqrt(dist)
            for t in range(n_deltas):
                ok = j.astype(dist.dtype) >= (deltas[t] * density).astype(dist.dtype) * volume
                found = found.at[rows, t].max(jnp.where(ok, j, 0), mode="drop")
            return found, inside.at[rows].add(1, mode="drop")

        def centres_block(b, state):
            found, inside, too_many, examined = state
            c = lax.dynamic_slice_in_dim(centre, b * block, block)
            rb = lax.dynamic_slice_in_dim(r, b * block, block)
            cand, total, ends = candidates(c, rb)

            def one(state):  # a window: whole centres from ``first``, candidates from slot s
                s, first, found, inside, too_many = state
                last = jnp.searchsorted(ends, s + window, side="right").astype(jnp.int32) - 1
                alone = last < first  # one centre with more candidates than the window
                too_many = jnp.maximum(too_many, jnp.where(alone, total[first], 0))
                end = jnp.where(alone, ends[first], ends[jnp.maximum(last, 0)])
                empty = (jnp.full(window, block, jnp.int32), jnp.full(window, jnp.inf, c.dtype))
                n_chunks = jnp.where(alone, 0, (end - s + cand.chunk - 1) // cand.chunk)
                chunk = lambda i, buffer: look(cand, c, rb, s + i * cand.chunk, end, buffer)  # noqa: E731
                rows, dist, _ = lax.fori_loop(0, n_chunks, chunk, Layout.varying(*empty, 0))
                found, inside = count(rows, dist, found, inside)
                return end, jnp.maximum(last, first) + 1, found, inside, too_many

            zero = jnp.zeros((), jnp.int32)
            start = (
                zero,
                zero,
                jnp.zeros((block, n_deltas), jnp.int32),
                jnp.zeros(block, jnp.int32),
            )
            start = Layout.varying(*start, too_many)
            _, _, f, i, too_many = lax.while_loop(lambda st: st[0] < ends[-1], one, start)
            found = lax.dynamic_update_slice_in_dim(found, f, b * block, 0)
            inside = lax.dynamic_update_slice_in_dim(inside, i, b * block, 0)
            return found, inside, too_many, jnp.maximum(examined, cand.examined)

        zero = jnp.zeros((), jnp.int32)
        state = (jnp.zeros((size, n_deltas), jnp.int32), jnp.zeros(size, jnp.int32), zero)
        state = Layout.varying(*state, jnp.zeros((), jnp.float32))
        found, inside, too_many, examined = lax.fori_loop(0, size // block, centres_block, state)
        needs = {
            **moved,
            "so_ghosts": ghost_need,
            "so_outside": jnp.sum(outside, dtype=jnp.int32),
            "so_window": too_many,
            "so_candidates": (examined > 2.0**31 - 2 * _CHUNK).astype(jnp.int32),
        }
        return found, inside, layout.device_max(needs)

    specs = (PARTICLES, SLOTS, SLOTS, P())
    return dec.sharded(local, specs, (SLOTS, SLOTS, P()))(particles, centres, radius, deltas)


def spherical_overdensity(particles, centres, radius, cosmo, cfg) -> dict:
    """Spherical-overdensity masses and radii (200m and 200c) around ``centres``.

    particles: :class:`distpm.Particles` on ``cfg``'s grid; centres (G, 3) [Mpc/h] (any
    points; wrapped into the box); radius [Mpc/h]: where to search, one for all or (G,),
    at most :func:`reach` (centres whose sphere reaches further are searched again with
    twice the radius, up to it). The masses depend on the search radius only where the
    mean density rises back above a threshold further out (a neighbour's sphere
    overlapping). The buffers for the ghosts and a window's candidates start at
    ``_GHOST_FACTOR`` times the ghosts of uniform particles and a quarter of the device's
    capacity, and grow to what a search needed (it then runs again).

    Returns numpy arrays (G,): ``M200m``, ``M200c`` [1e10 Msun/h], ``R200m``, ``R200c``
    [Mpc/h comoving], ``N200m``, ``N200c`` (particles), ``search`` [Mpc/h] (the radius
    searched last) and ``open`` (bool: a sphere may reach past :func:`reach`, its mass a
    lower bound).
    """
    box = np.asarray(cfg.box_size, np.float64)
    centres = np.mod(np.asarray(centres, np.float64).reshape(-1, 3), box)
    radius = np.broadcast_to(np.asarray(radius, np.float64), centres.shape[:1]).copy()
    limit = reach(cfg)
    if np.any(~(radius >= 0)) or np.any(radius > limit):
        raise ValueError(
            f"search radii must be in [0, {limit:.4g}] Mpc/h (half a split block's width, a "
            f"quarter of the box), got {radius.min():.4g} to {radius.max():.4g}"
        )
    deltas = thresholds(cosmo, float(jax.device_get(particles.a)))
    found = np.zeros((len(centres), len(deltas)), np.int64)
    inside = np.zeros(len(centres), np.int64)
    todo = np.arange(len(centres))
    while len(todo):
        found[todo], inside[todo] = _search(
            particles, centres[todo], radius[todo], list(deltas.values()), cfg
        )
        reached = np.any(found[todo] == inside[todo, None], axis=1) & (inside[todo] > 0)
        todo = todo[reached & (radius[todo] < limit)]
        radius[todo] = np.minimum(2 * radius[todo], limit)
    density = cfg.n_particles / math.prod(cfg.box_size)
    out = {"open": np.any(found == inside[:, None], axis=1) & (inside > 0), "search": radius}
    for (name, delta), n in zip(deltas.items(), found.T, strict=True):
        out[f"N{name}"] = n
        out[f"M{name}"] = n * particle_mass(cosmo, cfg)
        out[f"R{name}"] = np.cbrt(3 * n / (4 * math.pi * delta * density))
    return out


def _search(particles, centres, radius, deltas, cfg):
    """One search of :func:`spherical_overdensity`: (J (G, D), within the radius (G,)).

    Each device takes the centres in its block (by position, as it would take particles);
    every process builds its own devices' blocks from its copy of the centres."""
    dec = Decomposition.of(cfg)
    dtype = particles.pos.dtype
    widths = links.block_widths(cfg)
    ix, iy = (np.clip(centres[:, a] // widths[a], 0, dec.grid[a] - 1) for a in (0, 1))
    owner = (ix * dec.grid[1] + iy).astype(np.int64)
    size = 1 << max(6, (int(np.bincount(owner, minlength=dec.n_devices).max()) - 1).bit_length())
    order = np.argsort(owner, kind="stable")
    place = np.arange(len(owner)) - np.searchsorted(owner[order], owner[order])
    row = np.empty(len(owner), np.int64)
    row[order] = owner[order] * size + place  # each centre's row in the sharded table
    table = np.zeros((dec.n_devices * size, 3))
    table[row] = centres
    reach_of = np.zeros(dec.n_devices * size)
    reach_of[row] = radius

    def sharded(x):
        blocks = {b: x[b * size : (b + 1) * size].astype(dtype) for b in range(dec.n_devices)}
        return runtime.from_local_blocks(blocks, x.shape, dec.sharding(SLOTS))

    separation = (math.prod(cfg.box_size) / cfg.n_particles) ** (1 / 3)
    top = min(_round_up(float(radius.max(initial=0)), separation), reach(cfg))
    side = max(_round_up(float(np.median(radius)), separation), top / _COLUMNS)
    window, ghost_factor = _first_window(dec.capacity), _GHOST_FACTOR
    ball = knn_cells.margin(cfg, top)
    while True:  # buffers too small: again with room for what they needed
        found, inside, needs = _counts(
            particles, sharded(table), sharded(reach_of), jnp.asarray(deltas, dtype), cfg=cfg,
            top=top, side=side, size=size, window=window, ghost_factor=ghost_factor,
        )  # fmt: skip
        needs = jax.device_get(needs)
        ghost_need, window_need = needs.pop("so_ghosts"), needs.pop("so_window")
        if np.any(ghost_need > knn_cells.ghost_sizes(cfg, ball, ghost_factor)):
            ghost_factor = knn_cells.ghost_factor_for(cfg, [ball], ghost_need[None], ghost_factor)
        elif window_need > window:
            window = 1 << int(window_need - 1).bit_length()
        else:
            break
    overflow.check(needs, parallel_migrate.limits(cfg) | _limits())
    return to_host(found)[row], to_host(inside)[row]


def planned(state, cfg, size: int):
    """The search of a run's catalogue for :mod:`distpm.plan`: (function, abstract
    arguments, keywords), for ``size`` centres per device (the catalogue's records) and
    search radii up to ``PLANNED_RADIUS`` (or :func:`reach`)."""
    dec = Decomposition.of(cfg)
    separation = (math.prod(cfg.box_size) / cfg.n_particles) ** (1 / 3)
    top = min(_round_up(PLANNED_RADIUS, separation), reach(cfg))
    side = max(separation, top / _COLUMNS)
    rows = dec.n_devices * size
    dtype, sharded = state.pos.dtype, state.mask.sharding
    centres = jax.ShapeDtypeStruct((rows, 3), dtype, sharding=sharded)
    radius = jax.ShapeDtypeStruct((rows,), dtype, sharding=sharded)
    deltas = jax.ShapeDtypeStruct((2,), dtype, sharding=dec.sharding(P()))
    keywords = {"cfg": cfg, "top": top, "side": side, "size": size}
    keywords |= {"window": _first_window(dec.capacity), "ghost_factor": _GHOST_FACTOR}
    return _counts, (state, centres, radius, deltas), keywords


def _first_window(capacity: int) -> int:
    """Candidates sorted at a time, at first: a quarter of the device's capacity."""
    return max(_CHUNK, capacity // 4)


def _limits() -> dict:
    """The :class:`~distpm.parallel.overflow.Limit` of the search's fixed buffers (its ghosts
    and windows grow to what they needed)."""
    return {
        "so_outside": Limit(
            0,
            "spherical overdensity: {need} centres sent to a device beyond its ghosts",
            advice="distpm placed them wrong: please report this",
        ),
        "so_candidates": Limit(
            0,
            "spherical overdensity: more than 2^31 candidates on a device",
            advice="use more devices or smaller search radii",
        ),
    }
