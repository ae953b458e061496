"""Records keyed by a particle id, gathered on one device per key and sent back.

Runs inside ``shard_map``. To combine what several devices know of one
group (its members' count, mass, moments), every device sends a record per
group to the key's home device, ``hash(key) mod n_devices``; there all
records of a key meet and are reduced; :func:`send_back` returns each
record to the slot it came from. Routing uses the particle exchange of
:mod:`distpm.parallel.migrate` (x, then y), so values keep their gradients.
"""

from __future__ import annotations

import jax.numpy as jnp

from distpm.parallel import migrate


def home_device(keys, n_devices: int):
    """Home device of (n, 2) int32 keys: a hash of both words, mod ``n_devices``."""
    w0, w1 = (keys[:, i].astype(jnp.uint32) for i in (0, 1))
    h = w0 * jnp.uint32(0x9E3779B1) + w1
    h = (h ^ (h >> 15)) * jnp.uint32(0x85EBCA6B)
    h = h ^ (h >> 13)
    return (h % jnp.uint32(n_devices)).astype(jnp.int32)


def send_home(floats, ints, keys, mask, layout, bucket: int):
    """Send every record to its key's home device.

    floats: list of (n, ...) float arrays; ints: list of (n, ...) int32
    arrays; keys: (n, 2) int32; mask: (n,) valid records. Returns
    ``(floats, ints, keys, mask, origin, needs)``: the records now on this
    device (valid ones anywhere: ``mask``), ``origin`` for :func:`send_back`, and
    ``needs``: the "capacity" (records) and "exchange" slots a device needed, as in migration.
    """
    dest = home_device(keys, layout.n_devices)
    floats, (*ints, keys), mask, origin, needs = migrate.to_devices(
        floats, [*ints, keys], mask, dest, layout, bucket
    )
    return floats, ints, keys, mask, origin, needs


def send_back(floats, ints, mask, origin, layout, bucket: int):
    """Return records to the slots they came from (the inverse of :func:`send_home`).

    Returns ``(floats, ints, mask, needs)``.
    """
    return migrate.by_slot(floats, ints, mask, origin, layout, bucket)
