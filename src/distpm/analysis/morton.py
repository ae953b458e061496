"""Morton (z-order) keys, and a sort of the particles by them (or by any two-word
keys, :func:`sort_by_keys`) across all devices.

The key of a position interleaves the bits of its integer coordinates on a
grid of 2^bits cells per axis (x the most significant of each triple), so
that particles close in the key order are close in space. With the default
21 bits per axis the key has 63 bits, held as two uint32 words (high, low)
that sort lexicographically like the key (jax runs in 32-bit mode).

The sort (inside ``shard_map``): every device samples its keys, the samples
of all devices give P - 1 splitters (weighted quantiles), every particle
travels to the device of its key range (:func:`distpm.parallel.migrate.to_devices`),
and each device sorts what it received. An optional second pass moves the
particles between devices so that device d holds the ranks
[floor(d N / P), floor((d + 1) N / P)) of the global order: N/P (+-1) each.

The sorted particles are meant for analysis: they no longer sit on the
device that owns their position, which the simulation's steps expect
(:func:`distpm.evolve` sends them back).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from distpm.ops import compact, sorting
from distpm.parallel import migrate, overflow
from distpm.parallel.decomposition import SLOTS, Decomposition
from distpm.state import PARTICLES, Particles

_SAMPLES = 1024  # keys each device contributes to the choice of splitters


def morton_keys(pos, box_size, *, bits: int = 21):
    """(n, 2) uint32 (high, low) words of the Morton keys of positions (n, 3) [Mpc/h].

    Positions are wrapped into the box; bits <= 21 per axis. The bits of a
    cell index are spread 7 at a time by shifts and masks (bit i to 3 i),
    not one at a time, which is faster. :mod:`distpm.analysis.bounds` uses
    these keys at 14 bits.
    """
    if not 1 <= bits <= 21:
        raise ValueError(f"bits must be in [1, 21], got {bits}")
    box = jnp.asarray(box_size, pos.dtype)
    cells = jnp.floor(jnp.mod(pos, box) / box * 2**bits)
    cells = jnp.clip(cells, 0, 2**bits - 1).astype(jnp.uint32)
    part = [jnp.zeros(pos.shape[0], jnp.uint32)] * 3  # levels 0-6, 7-13, 14-20: 21 key bits each
    for axis in range(3):  # x the most significant of each triple
        for i in range(3):
            part[i] = part[i] | (_spread((cells[:, axis] >> (7 * i)) & 127) << (2 - axis))
    high = (part[1] >> 11) | (part[2] << 10)  # key bits 32..62
    low = part[0] | (part[1] << 21)  # key bits 0..31
    return jnp.stack([high, low], axis=1)


def _spread(v):
    """Bits 0..6 of uint32 ``v`` moved to bits 0, 3, ..., 18."""
    v = (v | (v << 8)) & jnp.uint32(0x0000F00F)
    v = (v | (v << 4)) & jnp.uint32(0x000C30C3)
    return (v | (v << 2)) & jnp.uint32(0x00249249)


def _key_order(keys, valid, distinct=False):
    """Slot order that sorts valid keys ascending, invalid slots last (in slot order).

    Invalid slots get the high word 2^32 - 1, which no valid key has; with
    ``distinct`` (valid high words below 2^31), 2^31 + their slot instead,
    so that they differ in their leading bits too (see
    :func:`distpm.ops.sorting.argsort`).
    """
    if distinct:
        slot = jnp.arange(keys.shape[0], dtype=jnp.uint32)
        high = jnp.where(valid, keys[:, 0], jnp.uint32(1 << 31) | slot)
    else:
        high = jnp.where(valid, keys[:, 0], jnp.uint32(0xFFFFFFFF))
    return sorting.argsort(high, keys[:, 1], distinct=distinct)


def _below(a, b):
    """a < b for (n, 2) and (m, 2) key words, as an (n, m) table."""
    return (a[:, None, 0] < b[None, :, 0]) | (
        (a[:, None, 0] == b[None, :, 0]) & (a[:, None, 1] < b[None, :, 1])
    )


def _splitters(keys, valid, layout):
    """P - 1 keys that cut the global key order into P nearly equal ranges."""
    slots, n = compact(valid, valid.shape[0])  # valid slots first
    # random valid slots (a fixed key): a stride could follow a lattice in slot order
    pick = jax.random.randint(jax.random.key(0), (_SAMPLES,), 0, jnp.maximum(n, 1))
    sample = keys[slots[pick]]
    weight = jnp.full(_SAMPLES, n.astype(jnp.float32) / _SAMPLES)
    sample, weight = layout.gather_all(sample), layout.gather_all(weight)
    sorted_ = _key_order(sample, weight > 0)
    sample, weight = sample[sorted_], jnp.where(weight > 0, weight, 0)[sorted_]
    below = jnp.cumsum(weight) - weight  # samples' weight before each sample
    quota = jnp.arange(1, layout.n_devices, dtype=jnp.float32) * (
        jnp.sum(weight) / layout.n_devices
    )
    first = jnp.sum(below[None, :] < quota[:, None], axis=1) - 1  # last sample below each quota
    return sample[jnp.clip(first, 0, sample.shape[0] - 1)]


def _sorted_locally(particles, keys, distinct):
    order = _key_order(keys, particles.mask, distinct)
    return jax.tree.map(lambda x: x[order] if x.ndim else x, particles), keys[order]


@functools.partial(jax.jit, static_argnames=("cfg", "bucket", "room", "targets", "distinct"))
def _sort(particles, keys, cfg, bucket, room, targets, distinct):
    dec = Decomposition.of(cfg)

    def local(particles, keys):
        layout = dec.mesh
        cap = dec.capacity
        grow = lambda x: jnp.pad(x, [(0, room - cap)] + [(0, 0)] * (x.ndim - 1))  # noqa: E731
        particles = jax.tree.map(lambda x: grow(x) if x.ndim else x, particles)
        keys, valid = grow(keys), particles.mask
        dest = jnp.zeros(valid.shape, jnp.int32)
        if layout.n_devices > 1:
            split = _splitters(keys, valid, layout)
            dest = jnp.sum(~_below(keys, split), axis=1, dtype=jnp.int32)
        # what the exchange needs whatever overflows in it: a retry fits (the balancing
        # pass's own needs are measured after this one, so with balance a second retry may
        # still be needed once this pass fits)
        exact = migrate.route_needs(valid, dest, layout)
        particles, keys, needs = _send(particles, keys, dest, layout, bucket)
        needs = overflow.most(needs, exact)
        particles, keys = _sorted_locally(particles, keys, distinct)
        if targets is not None:  # second pass: global ranks to the devices that should hold them
            target, starts = (jnp.asarray(t, jnp.int32) for t in targets)
            me = layout.device_index()
            count = jnp.sum(particles.mask, dtype=jnp.int32)
            excess = layout.gather_all((count - target[me])[None])
            offset = jnp.sum(jnp.where(jnp.arange(layout.n_devices) < me, excess, 0))
            rank = offset + jnp.arange(valid.shape[0], dtype=jnp.int32)  # from my ideal start
            bounds = starts[me]  # every device's ideal start, from mine
            dest = jnp.clip(jnp.sum(rank[:, None] >= bounds[None, :], axis=1) - 1, 0, None)
            there = rank - bounds[dest]  # rank from the destination's ideal start
            particles, keys, more, there = _send(particles, keys, dest, layout, bucket, there)
            order = sorting.argsort(jnp.where(particles.mask, there, jnp.iinfo(jnp.int32).max))
            particles = jax.tree.map(lambda x: x[order] if x.ndim else x, particles)
            keys = keys[order]  # one int32 word: one pass, where the keys' two words take two
            needs = overflow.most(needs, more)
        held = jnp.sum(particles.mask, dtype=jnp.int32)  # valid slots first: keep cap
        particles = jax.tree.map(lambda x: x[:cap] if x.ndim else x, particles)
        return particles, keys[:cap], layout.device_max({**needs, "held": held})

    return dec.sharded(local, (PARTICLES, SLOTS), (PARTICLES, SLOTS, P()))(particles, keys)


def _send(particles, keys, dest, layout, bucket, *extra):
    """Particles, keys and ``extra`` int32 columns to devices ``dest``; returns
    (particles, keys, needs, *extra)."""
    floats = [particles.pos, particles.vel]
    ints = [particles.ids, jax.lax.bitcast_convert_type(keys, jnp.int32), *extra]
    (pos, vel), (ids, keys, *extra), mask, _, needs = migrate.to_devices(
        floats, ints, particles.mask, dest, layout, bucket
    )
    keys = jax.lax.bitcast_convert_type(keys, jnp.uint32)
    moved = particles.replace(pos=pos, vel=vel, ids=ids, mask=mask)
    return moved, keys, needs, *extra


@functools.partial(jax.jit, static_argnames=("box_size", "bits"))
def _morton_keys(pos, box_size, bits):
    return morton_keys(pos, box_size, bits=bits)


def morton_sort(particles: Particles, cfg, *, bits: int = 21, balance: bool = False):
    """Particles sorted by Morton key over all devices, and their keys.

    Returns (particles, keys) as :func:`sort_by_keys` does, with the keys
    of :func:`morton_keys` at ``bits`` per axis.
    """
    if not 1 <= bits <= 21:
        raise ValueError(f"bits must be in [1, 21], got {bits}")
    keys = _morton_keys(particles.pos, tuple(cfg.box_size), bits)
    # keys are right-aligned: only long ones differ in their leading 64 - log2(slots) bits
    return sort_by_keys(particles, keys, cfg, balance=balance, distinct=bits >= 20)


def _balance_targets(n: int, p: int):
    """(sizes, starts) of the balancing pass: device d holds the ranks
    [floor(d n / p), floor((d + 1) n / p)); starts[me][d] is device d's first
    rank seen from device me's, in int32 (far ones saturate, so no count wraps)."""
    first = [d * n // p for d in range(p + 1)]
    sizes = tuple(first[d + 1] - first[d] for d in range(p))
    limit = 2**31 - 1
    starts = tuple(
        tuple(max(-limit, min(limit, first[d] - first[me])) for d in range(p)) for me in range(p)
    )
    return sizes, starts


def sort_bucket(dec) -> int:
    """Slots a device first sends to one other in :func:`sort_by_keys` (grown on need)."""
    # two stages (x, then y) may crowd a device in between: grow its room to the need
    return min(dec.capacity, max(dec.exchange_size, -(-2 * dec.capacity // dec.n_devices)))


def sort_by_keys(particles: Particles, keys, cfg, *, balance: bool = False, distinct: bool = False):
    """Particles sorted by two-word keys over all devices, and their keys.

    keys: (slots, 2) uint32 words (high, low) per slot, compared
    lexicographically; a valid slot's high word must be below 2^32 - 1
    (that value marks empty slots). Returns (particles, keys): on every
    device the valid slots come first, in key order, and every key on
    device d precedes every key on device d + 1 (devices in the order of
    ``P(("x", "y"))`` blocks); equal keys may land on either side of a
    device boundary. With ``balance``, device d ends with the ranks
    [floor(d N / P), floor((d + 1) N / P)). Every particle (pos, vel,
    ids) is kept. The exchange buffers grow to what the sort needs (as in
    :func:`distpm.shares.redistribute`); a device that must end with
    more than its capacity of particles raises :class:`distpm.CapacityError`.
    ``distinct``: the keys seldom share their leading bits (Morton keys of
    particles at 20 or 21 bits do) and valid high words are below 2^31;
    the local sorts then usually take one pass instead of two
    (:func:`distpm.ops.sorting.argsort`).
    """
    dec = Decomposition.of(cfg)
    targets = _balance_targets(particles.count, dec.n_devices) if balance else None
    bucket = sort_bucket(dec)

    def run(bucket, room):
        moved, keys_out, needs = _sort(particles, keys, cfg, bucket, room, targets, distinct)
        return (moved, keys_out), needs

    return migrate.grown(run, cfg, bucket, dec.capacity)
