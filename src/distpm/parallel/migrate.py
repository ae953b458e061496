"""Particle migration: send each particle to the device that owns its position.

Runs inside ``shard_map``. Each device holds its particles in fixed-size
buffers of ``capacity`` slots with a boolean ``mask`` of valid slots; valid
slots are packed at the front. Migration routes particles in two stages,
along the "x" axis of the device grid and then along "y", so after it every
particle sits on the device (ix, iy) of its position, however far it moved.

One stage along an axis of p devices: every device sorts its leaving
particles by destination into p buckets of ``exchange_size`` slots, one
``all_to_all`` swaps the buckets, and the arrivals are packed after the
particles that stayed. Values move only by gathers and collectives, so
gradients flow through migration (the routing itself is integer data).

Between two steps, particles move a fraction of a pencil's width: those
that leave go to the next or previous device along the axis, and few of
them. So the step's migration first tries a neighbours-only exchange: two
small buffers of ``neighbour_size`` slots sent with ``ppermute`` (one on
an axis of 2 devices). If any device has a particle going further, or
more than fit, every device of the grid takes the full exchange for that
stage instead (a ``lax.cond`` on a flag reduced over the grid). Both give
the same particles on the same devices.

Overflow is never silent: each stage reports how many slots it needed
(``Needs``); :func:`check` turns an overflow into a :class:`CapacityError`
on the host.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from distpm.parallel.devices import AXES
from distpm.parallel.halo import shift


class CapacityError(RuntimeError):
    """A fixed-size particle buffer was too small; the message says which option to raise."""


def _pack(arrays, n: int):
    """Concatenate (n, ...) arrays of one dtype into one (n, k) array; return it and the widths."""
    if not arrays:
        return jnp.zeros((n, 0), jnp.float32), []
    cols = [a.reshape(a.shape[0], -1) for a in arrays]
    widths = [c.shape[1] for c in cols]
    return jnp.concatenate(cols, axis=1), widths


def _unpack(packed, widths, templates):
    out, start = [], 0
    for w, t in zip(widths, templates, strict=True):
        out.append(packed[:, start : start + w].reshape(packed.shape[:1] + t.shape[1:]))
        start += w
    return out


def _gather(x, index):
    """Rows ``x[index]``, zero where ``index`` is out of range."""
    return jnp.take(x, index, axis=0, mode="fill", fill_value=0)


def compact(valid, size):
    """Source row for each of ``size`` output slots, valid rows first in order; count of valid."""
    n = valid.shape[0]
    target = jnp.where(valid, jnp.cumsum(valid) - 1, size)
    source = (
        jnp.full(size, n, jnp.int32).at[target].set(jnp.arange(n, dtype=jnp.int32), mode="drop")
    )
    return source, jnp.sum(valid, dtype=jnp.int32)


def _send_plan(dest, leaving, p: int, bucket: int):
    """Source slot of every send-buffer entry (p buckets of ``bucket``); needed bucket size.

    Only the leaving particles are ranked: they are first packed into a
    short list (as long as the send buffer), which is sorted by
    destination. If more particles leave than the buffer holds, some bucket
    overflows, and the exact per-destination counts report it.
    """
    cap = dest.shape[0]
    size = p * bucket
    counts = jax.ops.segment_sum(leaving.astype(jnp.int32), dest, num_segments=p)
    candidates, _ = compact(leaving, size)  # slots of the first `size` leaving particles
    key = jnp.where(candidates < cap, jnp.take(dest, candidates, mode="clip"), p)
    order = jnp.argsort(key, stable=True)
    sorted_key, sorted_slot = key[order], candidates[order]
    first = jnp.searchsorted(sorted_key, jnp.arange(p, dtype=sorted_key.dtype))
    rank = jnp.arange(size, dtype=jnp.int32) - first[jnp.minimum(sorted_key, p - 1)]
    fits = (sorted_key < p) & (rank < bucket)
    target = jnp.where(fits, sorted_key * bucket + rank, size)
    source = jnp.full(size, cap, jnp.int32).at[target].set(sorted_slot, mode="drop")
    return source, jnp.max(counts)


def _neighbour_plan(dest, leaving, me, p: int, size: int):
    """Send lists to the next and previous device along the axis (one list when p == 2).

    Returns ([(step, source slots)], largest count to one neighbour, whether
    this device needs the full exchange: a particle goes further than a
    neighbour, or more than ``size`` go to one).
    """
    steps = (1,) if p == 2 else (1, -1)
    plans, needed, near = [], jnp.int32(0), jnp.zeros_like(leaving)
    for step in steps:
        going = leaving & (dest == (me + step) % p)
        source, count = compact(going, size)
        plans.append((step, source))
        needed, near = jnp.maximum(needed, count), near | going
    return plans, needed, (needed > size) | jnp.any(leaving & ~near)


def _sender_order(received, swap):
    """[from the previous device, from the next] in sender index order (swapped at the ends)."""
    from_prev, from_next = received
    return [jnp.where(swap, from_next, from_prev), jnp.where(swap, from_prev, from_next)]


def stage(floats, ints, mask, dest, me, name: str, p: int, bucket: int, near=None):
    """Route particles along mesh axis ``name`` (size p) to index ``dest``.

    floats: list of (cap, ...) float arrays (differentiable); ints: list of
    (cap, ...) int32 arrays; mask: (cap,) bool. dest: (cap,) int32
    destination along the axis; me: this device's index along it.
    near: None, or the slots per neighbour of a first, neighbours-only
    exchange (``ppermute`` to the next and previous device); when any
    device of the grid has a particle going further or more than ``near``
    going to one neighbour, every device takes the full exchange instead
    (``lax.cond`` on a flag reduced over the grid, so they all agree).
    Returns (floats, ints, mask, needed_capacity, needed_bucket).
    """
    cap = mask.shape[0]
    dest = jnp.where(mask, dest, me)
    leaving = dest != me
    int_arrays = [*ints, mask.astype(jnp.int32)]  # the mask travels as the last int column

    def send(rows):
        """The floats and ints of slots ``rows`` (out of range: zeros), each packed in one array."""
        f, _ = _pack([_gather(x, rows) for x in floats], rows.shape[0])
        i, _ = _pack([_gather(x, rows) for x in int_arrays], rows.shape[0])
        return f, i

    def arrive(recv_f, recv_i):
        """The particles that stayed, then the arrivals, in the slots of new arrays.

        Each array is gathered on its own from itself and its received rows,
        so that no packed copy of all the particles' columns is made.
        """
        valid = jnp.concatenate([mask & ~leaving, recv_i[:, -1] > 0])
        source, count = compact(valid, cap)

        def merge(x, received):
            return _gather(jnp.concatenate([x, received]), source)

        widths = [math.prod(x.shape[1:]) for x in floats]
        int_widths = [math.prod(x.shape[1:]) for x in int_arrays]
        out_f = [merge(x, y) for x, y in zip(floats, _unpack(recv_f, widths, floats), strict=True)]
        received = _unpack(recv_i, int_widths, int_arrays)
        out_i = [merge(x, y) for x, y in zip(int_arrays[:-1], received[:-1], strict=True)]
        return out_f, out_i, source < valid.shape[0], count

    def everyone():
        with jax.named_scope("migrate_all"):
            send_source, needed = _send_plan(dest, leaving, p, bucket)
            swap = lambda x: lax.all_to_all(x, name, 0, 0, tiled=True)  # noqa: E731
            send_f, send_i = send(send_source)
            return *arrive(swap(send_f), swap(send_i)), needed

    if near is None:
        return everyone()
    plans, near_needed, far = _neighbour_plan(dest, leaving, me, p, near)

    def neighbours():
        with jax.named_scope("migrate_neighbours"):
            sent = [(s, send(src)) for s, src in plans]
            recv_f = [shift(f, name, p, s) for s, (f, _) in sent]
            recv_i = [shift(i, name, p, s) for s, (_, i) in sent]
            if p > 2:  # arrivals in the order of their sender's index, as in the full exchange
                swap = (me == 0) | (me == p - 1)
                recv_f, recv_i = (_sender_order(r, swap) for r in (recv_f, recv_i))
            recv = arrive(jnp.concatenate(recv_f), jnp.concatenate(recv_i))
            return *recv, near_needed

    anyone_far = lax.pmax(far.astype(jnp.int32), AXES) > 0
    return lax.cond(anyone_far, everyone, neighbours)


def no_needs():
    """needs = [0, 0] as a per-device value (the start of a running maximum)."""
    return lax.pcast(jnp.zeros(2, jnp.int32), AXES, to="varying")


def by_position(floats, ints, mask, pos_index: int, layout, cell_size, bucket: int, near=None):
    """Send every particle to the owner of its position ``floats[pos_index]`` [Mpc/h].

    near: slots per neighbour of the neighbours-first exchange (see
    :func:`stage`), for particles that moved little since the last
    migration; None sends through the full exchange only.
    Returns (floats, ints, mask, needs) with needs = int32 [capacity, bucket]
    slots this device needed (maximum over the stages).
    """
    needs = no_needs()
    for axis, name in ((0, "x"), (1, "y")):
        p = layout.grid[axis]
        if p == 1:
            continue
        dest = layout.owner(layout.cell_coordinates(floats[pos_index], cell_size))[axis]
        me = layout.grid_index()[axis]
        floats, ints, mask, count, width = stage(
            floats, ints, mask, dest, me, name, p, bucket, near
        )
        needs = jnp.maximum(needs, jnp.stack([count, width]))
    return floats, ints, mask, needs


def home_slots(layout, cap: int):
    """(cap, 2) int32 [device index, slot] of this device's slots, to send particles home later.

    A pair rather than device * cap + slot, which would overflow int32 past
    2^31 slots in all.
    """
    slot = jnp.arange(cap, dtype=jnp.int32)
    device = jnp.full(cap, layout.device_index(), jnp.int32)
    return layout.varying(jnp.stack([device, slot], axis=1))  # per device even on a 2x1 grid


def _route(floats, ints, mask, dest, layout, bucket: int):
    """Send every particle to device ``dest`` (cap,) (linear index ix * py + iy), along x
    then y. Returns (floats, ints, mask, needs)."""
    py = layout.grid[1]
    needs = no_needs()
    for axis, name in ((0, "x"), (1, "y")):
        p = layout.grid[axis]
        if p == 1:
            continue
        along = dest // py if axis == 0 else dest % py
        me = layout.grid_index()[axis]
        floats, ints, mask, count, width = stage(
            floats, [*ints, dest], mask, along, me, name, p, bucket
        )
        *ints, dest = ints
        needs = jnp.maximum(needs, jnp.stack([count, width]))
    return floats, ints, mask, needs


def by_slot(floats, ints, mask, home, layout, bucket: int):
    """Send every particle to its global slot ``home`` = (device index, slot) (cap, 2).

    The inverse of any sequence of migrations, when ``home`` was set by
    :func:`home_slots` before them. Returns (floats, ints, mask, needs).
    """
    cap = mask.shape[0]
    floats, (*ints, home), mask, needs = _route(
        floats, [*ints, home], mask, home[:, 0], layout, bucket
    )
    source = (
        jnp.full(cap, cap, jnp.int32)
        .at[jnp.where(mask, home[:, 1], cap)]
        .set(jnp.arange(cap, dtype=jnp.int32), mode="drop")
    )
    floats = [_gather(f, source) for f in floats]
    ints = [_gather(i, source) for i in ints]
    return floats, ints, source < cap, needs


def to_devices(floats, ints, mask, dest, layout, bucket: int):
    """Send every particle to device ``dest`` (cap,) int32 (linear index ix * py + iy).

    Returns (floats, ints, mask, home, needs), ``home`` for :func:`by_slot`
    to send them back.
    """
    home = home_slots(layout, mask.shape[0])
    floats, (*ints, home), mask, needs = _route(floats, [*ints, home], mask, dest, layout, bucket)
    return floats, ints, mask, home, needs


def check(needs, cfg) -> None:
    """Raise :class:`CapacityError` if ``needs`` = [capacity, bucket] exceeds ``cfg``'s buffers."""
    capacity, bucket = (int(v) for v in jax.device_get(needs))
    if capacity > cfg.capacity:
        factor = capacity * cfg.n_devices / cfg.n_particles
        raise CapacityError(
            f"particle buffer overflow: a device needed {capacity} slots but has "
            f"{cfg.capacity} (capacity_factor={cfg.capacity_factor}); raise capacity_factor "
            f"to at least {math.ceil(factor * 100) / 100}"
        )
    if bucket > cfg.exchange_size:
        factor = bucket * cfg.n_devices / cfg.n_particles
        raise CapacityError(
            f"particle exchange overflow: a device sent {bucket} particles to one device but "
            f"has {cfg.exchange_size} slots per destination (exchange_factor="
            f"{cfg.exchange_factor}); raise exchange_factor to at least "
            f"{math.ceil(factor * 100) / 100}"
        )


def check_later(needs, cfg) -> None:
    """:func:`check` ``needs`` now if concrete, else when the traced computation runs.

    In the second case the :class:`CapacityError` is raised inside a
    ``jax.debug.callback``: the caller gets JAX's runtime error carrying its
    message (``jax.errors.JaxRuntimeError`` in jax 0.10) when it waits for the result.
    """
    if isinstance(needs, jax.core.Tracer):
        jax.debug.callback(lambda n: check(n, cfg), needs)
    else:
        check(needs, cfg)
