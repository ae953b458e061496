"""Particle migration: send each particle to the device that owns its position.

Runs inside ``shard_map``. Each device holds its particles in fixed-size
buffers of ``capacity`` slots with a boolean ``mask`` of valid slots (valid
slots anywhere). Migration routes particles in two stages, along the "x"
axis of the device grid and then along "y", so after it every particle
sits on the device (ix, iy) of its position, however far it moved.

One stage along an axis of p devices: every device lists its leaving
particles by destination in p buckets of ``exchange_size`` slots, one
``all_to_all`` swaps the buckets, and the arrivals take the slots left
free, in slot order. The particles that stay keep their slots: each array
is updated where it lies (the leavers' rows zeroed, the arrivals scattered
in), so a stage makes no copy of the particles and XLA reuses their
buffers (a copy per stage cost 33 bytes per slot). Values move only by
gathers, scatters and collectives, so gradients flow through migration
(the routing itself is integer data).

Between two steps, particles move a fraction of a pencil's width: those
that leave go to the next or previous device along the axis, and few of
them. So the step's migration first tries a neighbours-only exchange: two
small buffers of ``neighbour_size`` slots sent with ``ppermute`` (one on
an axis of 2 devices). If any device has a particle going further, or
more than fit, every device of the grid takes the full exchange for that
stage instead, in rounds of a fraction of its buckets (each round's mode is
agreed with a flag reduced over the grid). Only the receive buffers come
out of the ``lax.switch`` that picks the mode, so that the update of the
particles' arrays after it happens in place. A neighbours-only round puts
the particles in the slots one full exchange would; over several rounds
the slots may differ (the particles on each device are the same). Between
rounds a device holds its unsent leavers and its arrivals at once, so a
nearly full device that sends and receives more than a round's bucket can
report a capacity overflow that one exchange would have avoided.

Overflow is never silent: each stage reports the slots it needed, as the
named needs "capacity" and "exchange" (:mod:`distpm.parallel.overflow`);
:func:`check` turns an overflow into a :class:`~distpm.parallel.overflow.CapacityError`
on the host.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax import lax

from distpm.ops import compact, running_sum
from distpm.ops.buffers import zeros_after
from distpm.parallel import overflow
from distpm.parallel.decomposition import Decomposition
from distpm.parallel.devices import AXES
from distpm.parallel.halo import shift
from distpm.parallel.layout import Layout

INT32_MAX = 2**31 - 1


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


def _send_plan(dest, pending, p: int, bucket: int):
    """Source slot of every send-buffer entry (p buckets of ``bucket``): bucket j holds the
    first ``bucket`` pending particles going to j, in slot order (``cap`` where none is left).

    One compaction per destination (``lax.map``): its buffers are a bucket long, where
    ranking all pending particles at once would take several int32 arrays of up to p
    buckets (a full exchange's worth, 10 bytes per particle on an axis of 8 devices).
    """
    return lax.map(lambda j: compact(pending & (dest == j), bucket)[0], jnp.arange(p)).reshape(-1)


def _neighbour_plan(dest, pending, me, p: int, size: int):
    """Send lists (source slots) to the next and previous device along the axis (one list
    when p == 2), [(step, slots)]."""
    steps = (1,) if p == 2 else (1, -1)
    return [(step, compact(pending & (dest == (me + step) % p), size)[0]) for step in steps]


def _sender_order(received, swap):
    """[from the previous device, from the next] in sender index order (swapped at the ends)."""
    from_prev, from_next = received
    return [jnp.where(swap, from_next, from_prev), jnp.where(swap, from_prev, from_next)]


def _index_dtype(p: int):
    """The smallest signed integer type that holds the indices 0 .. p - 1."""
    return next(t for t in (jnp.int8, jnp.int16, jnp.int32) if p - 1 <= jnp.iinfo(t).max)


def _varying(*xs) -> list:
    """``xs`` typed as different on every device (see :meth:`Layout.varying`), as a list."""
    return [Layout.varying(x) for x in xs]


# the step's full exchange runs in max(EXCHANGE_ROUNDS, p) rounds of exchange_size / rounds per
# destination: a round receives about exchange_size rows (p ceil(exchange_size / rounds)), a
# quarter of the p buckets on 4 devices, whatever the number of devices along the axis
EXCHANGE_ROUNDS = 4


def stage(floats, ints, mask, dest, me, name: str, p: int, bucket: int, near=None):
    """Route particles along mesh axis ``name`` (size p) to index ``dest``.

    floats: list of (cap, ...) float arrays (differentiable); ints: list of
    (cap, ...) int32 arrays; mask: (cap,) bool. dest: (cap,) int32
    destination along the axis; me: this device's index along it.
    bucket: slots a device may send to one other device in this stage.

    near: None: one full exchange (``all_to_all``) of ``bucket`` slots
    per destination. Else the slots per neighbour of a neighbours-only
    exchange (``ppermute`` to the next and previous device), taken when
    every device's leavers go to its neighbours and fit; otherwise every
    device takes the full exchange, in max(EXCHANGE_ROUNDS, p) rounds of
    ``bucket`` / rounds per destination (buffers of about ``bucket`` rows; a
    round with nothing left to send costs a flag). The mode of each round is agreed over the
    grid (a ``pmax``). A neighbours-only round puts the particles in the
    slots a full exchange of them would.
    Returns (floats, ints, mask, needed_capacity, needed_bucket): slots this
    device needed (0 when nothing moved) and the most it had to send to one
    device (over ``bucket``: the others stayed where they were).
    """
    cap = mask.shape[0]
    # typed per device: the rounds' carries and the modes' results must agree
    floats, ints = _varying(*floats), _varying(*ints)
    # the destinations in the smallest integers that hold them, and a slot whose particle
    # is sent (or that holds none) has this device's: where they differ, a leaver is still
    # pending. (An int32 array and a bool one, kept through all rounds, were 7.5 bytes per
    # particle of the initial conditions' peak on a GPU.)
    small = _index_dtype(p)
    me = me.astype(small)
    mask, dest = _varying(mask, jnp.where(mask, dest.astype(small), me))
    pending = dest != me  # leavers not sent yet
    counts = jax.ops.segment_sum(pending.astype(jnp.int32), dest, num_segments=p)
    needed_bucket = jnp.max(counts)
    rounds = 1 if near is None else max(EXCHANGE_ROUNDS, p)
    per_round = -(-bucket // rounds)
    lists = 0 if near is None else (1 if p == 2 else 2)
    rows = max(p * per_round, lists * (near or 0))  # rows received in a round, in every mode
    int_widths = [math.prod(x.shape[1:]) for x in ints] + [1]  # the mask travels last
    widths = [math.prod(x.shape[1:]) for x in floats]

    def send(floats, ints, mask, slots):
        """The floats and ints (then the mask) of ``slots`` (out of range: zeros), packed."""
        f, _ = _pack([_gather(x, slots) for x in floats], slots.shape[0])
        int_rows = [_gather(x, slots) for x in ints] + [_gather(mask, slots).astype(jnp.int32)]
        i, _ = _pack(int_rows, slots.shape[0])
        return f, i

    def placed(mask, recv_i, left):
        """Slots of the arrivals: arrival k (in the order received) takes the k-th free
        slot (no particle, or one sent away now) in slot order; ``cap`` if none is left."""
        arrived = recv_i[:, -1] > 0
        free = (~mask).at[left].set(True, mode="drop")
        holes, n_free = compact(free, rows)
        rank = running_sum(arrived, jnp.int32) - 1
        target = jnp.where(arrived, jnp.take(holes, rank, mode="clip"), cap)
        # slots needed, cap + (arrivals - free slots), saturated below 2^31 (no int32 wrap)
        over = jnp.sum(arrived, dtype=jnp.int32) - n_free
        held = jnp.where(over > 0, cap + jnp.minimum(over, INT32_MAX - cap), cap + over)
        return target, held

    def padded(recv_f, recv_i, left):
        extra = rows - left.shape[0]
        pad = lambda r: jnp.pad(r, [(0, extra), (0, 0)])  # noqa: E731
        return pad(recv_f), pad(recv_i), jnp.pad(left, (0, extra), constant_values=cap)

    def everyone(floats, ints, mask, dest):
        pending = dest != me
        with jax.named_scope("migrate_all"):
            left = _send_plan(dest, pending, p, per_round)
            swap = lambda x: lax.all_to_all(x, name, 0, 0, tiled=True)  # noqa: E731
            send_f, send_i = send(floats, ints, mask, left)
            recv_f, recv_i, left = padded(swap(send_f), swap(send_i), left)
            return recv_f, recv_i, left, *placed(mask, recv_i, left)

    def neighbours(floats, ints, mask, dest):
        pending = dest != me
        with jax.named_scope("migrate_neighbours"):
            plans = _neighbour_plan(dest, pending, me, p, near)
            sent = [(s, send(floats, ints, mask, src)) for s, src in plans]
            recv_f = [shift(f, name, p, s) for s, (f, _) in sent]
            recv_i = [shift(i, name, p, s) for s, (_, i) in sent]
            if p > 2:  # arrivals in the order of their sender's index, as in the full exchange
                swap = (me == 0) | (me == p - 1)
                recv_f, recv_i = (_sender_order(r, swap) for r in (recv_f, recv_i))
            left = jnp.concatenate([src for _, src in plans])
            recv_f, recv_i, left = padded(jnp.concatenate(recv_f), jnp.concatenate(recv_i), left)
            return recv_f, recv_i, left, *placed(mask, recv_i, left)

    def nothing(floats, ints, mask, dest):
        recv_f = jnp.zeros((rows, sum(widths)), floats[0].dtype if floats else jnp.float32)
        recv_i = jnp.zeros((rows, sum(int_widths)), jnp.int32)
        recv_f, recv_i, none = _varying(recv_f, recv_i, jnp.full(rows, cap, jnp.int32))
        return recv_f, recv_i, none, none, jnp.sum(mask[:0], dtype=jnp.int32)  # needs no slot

    def one_round(_, carry):
        floats, ints, mask, dest, counts, held = carry
        if near is None:
            recv_f, recv_i, left, target, now = everyone(floats, ints, mask, dest)
        else:
            others = jnp.ones(p, bool).at[(me + 1) % p].set(False).at[(me - 1) % p].set(False)
            far = jnp.any((counts > 0) & others) | jnp.any(counts > near)
            code = jnp.where(jnp.any(counts > 0), jnp.where(far, 2, 1), 0)
            mode = lax.pmax(code, AXES)  # the same on every device of the grid
            recv_f, recv_i, left, target, now = lax.switch(
                mode, [nothing, neighbours, everyone], floats, ints, mask, dest
            )
        # only the round's buffers come out of the switch (a few % of the slots): the
        # particles' own arrays are updated here, in place
        received_f = _unpack(recv_f, widths, floats)
        received_i = _unpack(recv_i, int_widths, [*ints, mask])
        # the leavers' rows are cleared only once both exchanges are received (zeros made
        # from a flag of each), hence after the rows were read to be sent: XLA then clears
        # each array in place, not a copy of it
        ready = recv_i[:1, -1] > 0
        if recv_f.shape[1]:
            ready = ready | jnp.isnan(recv_f[:1, 0])

        def merge(x, received):
            # the slots in left and in target are distinct, but for the out-of-range fill,
            # which is dropped: unique indices keep the scatters' derivatives simple (JAX
            # otherwise tracks which duplicate wins, with arrays as large as x)
            cleared = zeros_after((left.shape[0], *x.shape[1:]), x.dtype, ready)
            x = x.at[left].set(cleared, mode="drop", unique_indices=True)
            return x.at[target].set(received.astype(x.dtype), mode="drop", unique_indices=True)

        floats = [merge(x, y) for x, y in zip(floats, received_f, strict=True)]
        ints = [merge(x, y) for x, y in zip(ints, received_i[:-1], strict=True)]
        mask = merge(mask, received_i[-1] > 0)
        sent = jax.ops.segment_sum(
            (left < cap).astype(jnp.int32), jnp.take(dest, left, mode="clip"), num_segments=p
        )
        dest = dest.at[left].set(me, mode="drop")
        return floats, ints, mask, dest, counts - sent, jnp.maximum(held, now)

    zero = jnp.sum(mask[:0], dtype=jnp.int32)  # typed like the mask
    carry = (floats, ints, mask, dest, counts, zero)
    floats, ints, mask, _, _, held = lax.fori_loop(0, rounds, one_round, carry)
    return floats, ints, mask, held, needed_bucket


def no_needs() -> dict:
    """Zero "capacity" and "exchange" needs per device (the start of a running maximum)."""
    zero = lax.pcast(jnp.zeros((), jnp.int32), AXES, to="varying")
    return {"capacity": zero, "exchange": zero}


def by_position(floats, ints, mask, pos_index: int, layout, cell_size, bucket: int, near=None):
    """Send every particle to the owner of its position ``floats[pos_index]`` [Mpc/h].

    near: slots per neighbour of the neighbours-first exchange (see
    :func:`stage`), for particles that moved little since the last
    migration; None sends through the full exchange only.
    Returns (floats, ints, mask, needs) with needs the "capacity" and "exchange"
    (per destination) slots this device needed, the maximum over the stages.
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
        needs = overflow.most(needs, {"capacity": count, "exchange": width})
    return floats, ints, mask, needs


def elsewhere(pos, mask, layout, cell_size):
    """int32 count of this device's valid slots whose position [Mpc/h] another device owns."""
    ix, iy = layout.owner(layout.cell_coordinates(pos, cell_size))
    me = layout.grid_index()
    return jnp.sum(mask & ((ix != me[0]) | (iy != me[1])), dtype=jnp.int32)


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
        needs = overflow.most(needs, {"capacity": count, "exchange": width})
    return floats, ints, mask, needs


def route_needs(mask, dest, layout) -> dict:
    """The needs of sending every valid particle to device ``dest`` (cap,) (as
    :func:`to_devices` does) had no bucket been too small: "exchange", the most leavers a
    device sends to one other in either stage, and "capacity", the most particles a device
    holds after either; the same on every device.

    A stage whose bucket is too small keeps the rest where they were, so what the next stage
    then counts understates what it needs once the bucket is grown, and a retry with those
    needs can overflow again (a Morton sort at the defaults on 4x2 ran four times). These
    come from every device's count per destination (one all-gather of n_devices numbers),
    so one retry with them fits. Where n_devices x cap reaches 2^31 the sums are taken in
    float32 (to a relative 6e-8).
    """
    px, py = layout.grid
    n, cap = px * py, mask.shape[0]
    wide = n * cap >= 2**31
    dtype = jnp.float32 if wide else jnp.int32
    per_dest = jax.ops.segment_sum(mask.astype(dtype), jnp.where(mask, dest, 0), num_segments=n)
    c = layout.gather_all(per_dest[None]).reshape(px, py, px, py)  # (sx, sy) -> (ix, iy)
    to_column = jnp.sum(c, axis=3)  # (sx, sy, ix): along x first
    sent_x = jnp.where(jnp.eye(px, dtype=bool)[:, None, :], 0, to_column)
    held_x = jnp.sum(to_column, axis=0)  # (ix, sy)
    to_row = jnp.sum(c, axis=0)  # (sy, ix, iy): then along y, from (ix, sy)
    sent_y = jnp.where(jnp.eye(py, dtype=bool)[:, None, :], 0, to_row)
    held_y = jnp.sum(to_row, axis=0)  # (ix, iy)
    out = {
        "exchange": jnp.maximum(jnp.max(sent_x), jnp.max(sent_y)),
        "capacity": jnp.maximum(jnp.max(held_x), jnp.max(held_y)),
    }
    if wide:
        out = {k: jnp.minimum(v, 2.0**31 - 128).astype(jnp.int32) for k, v in out.items()}
    return out


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


def key_home(keys, n_devices: int):
    """The home device of (n, 2) int32 keys (particle ids): a hash of both words, mod
    ``n_devices``."""
    w0, w1 = (keys[:, i].astype(jnp.uint32) for i in (0, 1))
    h = w0 * jnp.uint32(0x9E3779B1) + w1
    h = (h ^ (h >> 15)) * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    return (h % jnp.uint32(n_devices)).astype(jnp.int32)


def by_key(floats, ints, keys, mask, layout, bucket: int):
    """Send every record to its key's home device (:func:`key_home`), where all records of
    a key meet: what several devices know of one group (its count, mass, moments) is
    combined there. Returns (floats, ints, keys, mask, home, needs), ``home`` for
    :func:`by_slot` to send the records back."""
    dest = key_home(keys, layout.n_devices)
    floats, (*ints, keys), mask, home, needs = to_devices(
        floats, [*ints, keys], mask, dest, layout, bucket
    )
    return floats, ints, keys, mask, home, needs


def grown(run, cfg, bucket: int, room: int):
    """``run(bucket, room)`` -> (result, needs) again with larger buffers until they hold.

    For one-off moves (redistribution, sorting) whose buffers may grow beyond the config's
    for a while: ``needs`` are "capacity" (room while the stages run), "exchange" (bucket)
    and "held" (what a device ends with), and only "held" over the capacity of
    ``Decomposition.of(cfg)`` raises.
    Returns the result of the first run that fitted.
    """
    while True:
        result, needs = run(bucket, room)
        needs = {name: int(v) for name, v in jax.device_get(needs).items()}
        check({"capacity": needs["held"]}, cfg)
        if needs["exchange"] <= bucket and needs["capacity"] <= room:
            return result
        room = max(room, needs["capacity"])
        bucket = min(room, max(bucket, needs["exchange"]))


def limits(cfg) -> dict:
    """The :class:`~distpm.parallel.overflow.Limit` of migration's buffers under ``cfg``."""
    dec = Decomposition.of(cfg)
    share = cfg.n_particles / dec.n_devices  # slots per unit of either factor
    return {
        "capacity": overflow.Limit(
            dec.capacity,
            "particle buffer overflow: a device needed {need} slots but has {have}",
            "capacity_factor",
            cfg.parallel.capacity_factor,
            share,
        ),
        "exchange": overflow.Limit(
            dec.exchange_size,
            "particle exchange overflow: a device sent {need} particles to one device but "
            "has {have} slots per destination",
            "exchange_factor",
            cfg.parallel.exchange_factor,
            share,
        ),
        "elsewhere": overflow.Limit(
            0,
            "{need} particles lie outside the block of the device that holds them",
            advice="let them migrate first (distpm.density's default, migrate=True)",
        ),
    }


def check(needs, cfg) -> None:
    """Raise :class:`~distpm.parallel.overflow.CapacityError` if migration's ``needs``
    exceed ``cfg``'s buffers."""
    overflow.check(needs, limits(cfg))


def checked(out, needs, cfg):
    """``out`` once migration's ``needs`` are checked against ``cfg``'s buffers: now if
    they are concrete, else as NaN results (see :func:`distpm.parallel.overflow.checked`)."""
    return overflow.checked(out, needs, limits(cfg))
