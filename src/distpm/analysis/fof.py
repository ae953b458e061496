"""Friends-of-friends groups of the particles, the same on any device grid.

Two particles are friends if they are closer than the linking length
l = b * (V / N)^(1/3) (b is ``linking_length``, a fraction of the mean
inter-particle separation; periodic box); a group is a set of particles
joined by chains of friends. Each group is labelled by its smallest
particle id, so the labels do not depend on the device grid, the number of
processes or the order of the particles.

On each device (inside ``shard_map``):

1. ghosts: copies of the particles within l of the block's faces, and
   periodic images (:mod:`distpm.parallel.ghosts`), so that every pair of
   friends lies on the devices of both its members;
2. links: the pairs closer than l among the device's particles and ghosts,
   found through a cell grid (:mod:`distpm.analysis.links`);
3. local groups: the connected components of the device's nodes, joined in a
   union-find forest as the pairs are found (no list of pairs is kept);
4. merge: every particle's label starts as its id; in each round the ghosts
   take their owners' labels and every node the smallest label of its
   local group, until no label changes on any device;
5. sizes: a group that touches a face between devices is counted on the
   home device of its label (:func:`distpm.parallel.migrate.by_key`); particles in
   groups of fewer than ``min_members`` get the label -1.

Labels are integers: they have no gradient.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from distpm import shares
from distpm.analysis import links
from distpm.ops import compact, sorting
from distpm.parallel import ghosts, overflow
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel.decomposition import SLOTS, Decomposition
from distpm.parallel.overflow import Limit
from distpm.parallel.runtime import to_host
from distpm.state import PARTICLES, Particles, linear_ids, wrap

_CHUNK = 1 << 20  # candidate pairs examined at once, at most
_GHOST_FLOOR = 64  # ghost slots per face at least


@dataclasses.dataclass(frozen=True)
class FoFOptions:
    """Static settings of :func:`fof`.

    linking_length: b, in units of the mean inter-particle separation.
    min_members: smallest group that keeps its label.
    ghost_factor: slots for the particles a device copies across one face,
        in units of their number if the particles were uniform (capacity
        times the linking length over the block's width; at least 64).
    """

    linking_length: float = 0.2
    min_members: int = 20
    ghost_factor: float = 4.0

    def __post_init__(self):
        if not 0 < self.linking_length < math.inf:
            raise ValueError(f"linking_length must be > 0, got {self.linking_length!r}")
        if int(self.min_members) != self.min_members or self.min_members < 1:
            raise ValueError(f"min_members must be an integer >= 1, got {self.min_members!r}")
        if not 0 < self.ghost_factor < math.inf:
            raise ValueError(f"ghost_factor must be > 0, got {self.ghost_factor!r}")


def linking_distance(cfg, linking_length: float) -> float:
    """[Mpc/h] b times the mean inter-particle separation (V / N)^(1/3)."""
    return linking_length * (math.prod(cfg.box_size) / cfg.n_particles) ** (1 / 3)


def _expected_ghosts(cfg, opts) -> list[float]:
    """Particles within the linking length of one face, per axis, if they were uniform."""
    margin, capacity = _margin(cfg, opts), Decomposition.of(cfg).capacity
    return [capacity * margin / w for w in links.block_widths(cfg)]


def _sizes(cfg, opts):
    """Ghost slots per face for each axis' pass, and node slots."""
    capacity = Decomposition.of(cfg).capacity
    ghosts, nodes = [], capacity
    for expected in _expected_ghosts(cfg, opts):
        size = min(nodes, max(_GHOST_FLOOR, math.ceil(opts.ghost_factor * expected)))
        ghosts.append(size)
        nodes += 2 * size
    return ghosts, nodes


def _margin(cfg, opts) -> float:
    """[Mpc/h] width of the ghost layer: the linking length plus room for round-off
    (relative to the linking length and to the box: float32 frame coordinates)."""
    slack = 8 * float(np.finfo(np.float32).eps) * max(cfg.box_size)
    return linking_distance(cfg, opts.linking_length) * (1 + 1e-4) + 2 * slack


def local_labels(pos, ids, mask, cfg, opts):
    """Group labels (cap, 2) int32 of a device's particles (inside ``shard_map``).

    pos [Mpc/h] on their owners; ids (cap, 2) int32. Returns (labels with
    -1 for small groups and empty slots, the needs of :func:`limits`' names).
    """
    dec = Decomposition.of(cfg)
    layout = dec.mesh
    distance = linking_distance(cfg, opts.linking_length)
    margin = _margin(cfg, opts)
    ghost_sizes, n_nodes = _sizes(cfg, opts)
    cap = mask.shape[0]

    widths, to_frame = links.frame(cfg, layout, margin)
    sources, rel, valid, image_of, ghost_need = ghosts.plan(
        to_frame(pos), mask, widths, margin, dec.grid, ghost_sizes
    )

    # the nodes near a face between devices: their groups' sizes are summed across devices
    split = [axis for axis in (0, 1) if dec.grid[axis] > 1]
    at_face = jnp.zeros(n_nodes, bool)
    for axis in split:
        at_face |= (rel[:, axis] < 2 * margin) | (rel[:, axis] >= widths[axis])

    extent = [w + 2 * margin for w in widths]
    side, n_cells = links.cell_grid(extent, (distance + margin) / 2)  # >= l + slack
    order, cells = links.sort_by_cell(rel, valid, side, n_cells)
    valid_s, at_face = valid[order], at_face[order]
    chunk = min(_CHUNK, max(4096, n_nodes // 4))  # memory in proportion to the nodes
    rank = jnp.zeros(n_nodes, jnp.int32).at[order].set(jnp.arange(n_nodes, dtype=jnp.int32))
    # periodic images: the same particle as the node they copy
    copy = image_of[order]
    node = jnp.arange(n_nodes, dtype=jnp.int32)
    copies = (jnp.where(copy >= 0, node, 0), jnp.where(copy >= 0, rank[jnp.maximum(copy, 0)], 0))
    xyz = [ghosts.fetch(sources, x, dec.grid)[order] for x in links.columns(pos)]
    root, examined = links.friends(
        xyz, cells, valid_s, n_cells, cfg.box_size, distance, chunk, copies
    )

    owned = rank[:cap]  # sorted place of each particle slot

    def merge(labels):
        node_labels = ghosts.fetch(sources, labels, dec.grid)[order]
        return links.smallest_key(node_labels, valid_s, root, n_nodes)

    def round_(state):
        labels, _ = state
        new = merge(labels)[owned]
        changed = jnp.any((new != labels) & mask[:, None])
        return new, layout.device_max(changed.astype(jnp.int32)) > 0

    labels, _ = jax.lax.while_loop(lambda s: s[1], round_, round_((ids, None)))
    node_labels = merge(labels)

    # sizes: count owned members per local group; groups at a face are summed at home
    at_face = jax.ops.segment_max((at_face & valid_s).astype(jnp.int32), root, n_nodes) > 0
    is_owned = jnp.zeros(n_nodes, bool).at[owned].set(mask)
    count = jax.ops.segment_sum(is_owned.astype(jnp.int32), root, n_nodes)
    is_root = root == jnp.arange(n_nodes, dtype=jnp.int32)
    too_many = (examined > 2.0**31 - 2 * chunk).astype(jnp.int32)  # int32 candidate count
    needs = {"fof_ghosts": ghost_need, "fof_pairs": too_many}
    if split:
        record_size = _record_size(cfg, opts)
        shared = is_root & at_face & (count > 0)
        slot, n_records = compact(shared, record_size)
        keys = jnp.take(node_labels, slot, axis=0, mode="fill", fill_value=0)
        counts = jnp.take(count, slot, mode="fill", fill_value=0)
        total, route_needs = _sum_by_key(keys, counts, slot < n_nodes, layout, record_size)
        count = count.at[jnp.where(slot < n_nodes, slot, n_nodes)].set(total, mode="drop")
        route = jnp.maximum(route_needs["capacity"], route_needs["exchange"])
        needs["fof_records"] = jnp.maximum(n_records, route)
    size = count[root][owned]
    labels = jnp.where(mask[:, None] & (size[:, None] >= opts.min_members), labels, -1)
    return labels, layout.device_max(needs)


def _sum_by_key(keys, counts, valid, layout, size: int):
    """Per record, the sum of ``counts`` over the records of all devices with its key."""
    (), (counts,), keys, valid, origin, needs = parallel_migrate.by_key(
        [], [counts], keys, valid, layout, size
    )
    k0 = jnp.where(valid, keys[:, 0], links.INT_MAX)
    k1 = jnp.where(valid, keys[:, 1], links.INT_MAX)
    order = sorting.argsort(k0, k1)
    k0, k1 = k0[order], k1[order]
    run, _, _ = links.runs(k0, k1)
    totals = jax.ops.segment_sum(counts[order], run, size)[run]
    totals = jnp.zeros_like(counts).at[order].set(totals)
    (), (totals,), _, back = parallel_migrate.by_slot([], [totals], valid, origin, layout, size)
    return totals, overflow.most(needs, back)


@functools.partial(jax.jit, static_argnames=("cfg", "opts"))
def _fof_particles(particles, cfg, opts):
    dec = Decomposition.of(cfg)

    def local(particles):
        layout = dec.mesh
        pos = wrap(particles.pos, cfg.box_size)
        home = parallel_migrate.home_slots(layout, dec.capacity)
        (pos,), (ids, home), mask, moved = parallel_migrate.by_position(
            [pos],
            [particles.ids, home],
            particles.mask,
            0,
            layout,
            cfg.cell_size,
            dec.exchange_size,
        )
        labels, needs = local_labels(pos, ids, mask, cfg, opts)
        # back to the slots the particles came in (the same ones unless some had left their block)
        (), (labels,), _, back = parallel_migrate.by_slot(
            [], [labels], mask, home, layout, dec.exchange_size
        )
        labels = jnp.where(particles.mask[:, None], labels, -1)
        return labels, needs, layout.device_max(overflow.most(moved, back))

    return dec.sharded(local, (PARTICLES,), (SLOTS, P(), P()))(particles)


def _record_size(cfg, opts) -> int:
    """Slots for the records of groups at a face: the particles sent across split faces."""
    ghosts, _ = _sizes(cfg, opts)
    return sum(2 * g for g, p in zip(ghosts, Decomposition.of(cfg).grid, strict=False) if p > 1)


def limits(cfg, opts) -> dict:
    """The :class:`~distpm.parallel.overflow.Limit` of FoF's buffers (needs from local_labels)."""
    sizes, _ = _sizes(cfg, opts)
    records = _record_size(cfg, opts)
    ghost = ("ghost_factor", opts.ghost_factor)
    return {
        "fof_ghosts": Limit(
            tuple(sizes),
            "FoF ghost overflow: a device needed {need} slots for the particles near one face "
            "but has {have}",
            *ghost,
            tuple(_expected_ghosts(cfg, opts)),
        ),
        "fof_records": Limit(
            records,
            "FoF ghost overflow: a device needed {need} slots for the groups at its faces but "
            "has {have}",
            *ghost,
            max(records, 1) / opts.ghost_factor,
        ),
        "fof_pairs": Limit(
            0,
            "FoF: a device has more than 2^31 candidate pairs (dense regions and many "
            "particles per device)",
            advice="use more devices or a smaller linking_length",
        ),
    }


def fof(particles, cfg, *, linking_length=0.2, min_members=20, ghost_factor=4.0):
    """Friends-of-friends group labels of a run's particles.

    particles: :class:`distpm.Particles` on ``cfg``'s device grid (for an
    array of positions: :func:`fof_points`). linking_length: b in units of
    the mean inter-particle separation (:func:`linking_distance` gives it in
    Mpc/h); min_members: smaller groups get no label.

    Returns (slots, 2) int32 labels sharded like ``particles.ids``: the id
    words of the group's smallest particle id, -1 in both words for
    particles in groups below ``min_members`` and for empty slots
    (:func:`distpm.linear_ids` turns them into int64 Lagrangian indices).
    Too small a buffer raises :class:`distpm.CapacityError` naming the
    option to raise. Not for use under ``jit``: it reads its buffers' needs
    on the host.
    """
    if not isinstance(particles, Particles):
        raise TypeError(
            f"fof takes distpm.Particles, got {type(particles).__name__}; for an (N, 3) array "
            f"of positions use distpm.fof_points"
        )
    opts = FoFOptions(linking_length, min_members, ghost_factor)
    _check_grid(cfg, opts)
    return _fof(particles, cfg, opts)


def fof_points(pos, cfg, *, linking_length=0.2, min_members=20, ghost_factor=4.0) -> np.ndarray:
    """Friends-of-friends groups of ``cfg.n_particles`` positions (N, 3) [Mpc/h] in any order.

    The options are :func:`fof`'s. Returns a numpy (N,) int64 array: the
    smallest row index of each point's group, -1 for points in groups below
    ``min_members``.
    """
    opts = FoFOptions(linking_length, min_members, ghost_factor)
    _check_grid(cfg, opts)
    particles = shares.from_positions(pos, cfg)  # ids: the row indices
    labels = linear_ids(to_host(_fof(particles, cfg, opts)), cfg.particle_shape)
    return shares.in_row_order(particles, labels, cfg)


def _fof(particles, cfg, opts):
    labels, needs, moved = _fof_particles(particles, cfg, opts)
    overflow.check(overflow.most(needs, moved), parallel_migrate.limits(cfg) | limits(cfg, opts))
    return labels


def _check_grid(cfg, opts):
    distance, grid = linking_distance(cfg, opts.linking_length), Decomposition.of(cfg).grid
    for axis, p in enumerate(grid):
        width = cfg.box_size[axis] / p
        if p > 1 and width < 2.01 * distance:
            raise ValueError(
                f"the device grid {grid} makes blocks {width:.3g} Mpc/h wide along "
                f"axis {axis}, less than twice the linking length {distance:.3g} Mpc/h; use "
                f"fewer devices along that axis"
            )
    if min(cfg.box_size) < 3.01 * distance:
        raise ValueError(
            f"the box {cfg.box_size} is smaller than 3 linking lengths ({distance:.3g} Mpc/h)"
        )
