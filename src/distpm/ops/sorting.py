"""A stable argsort by one or two 32-bit words, through sorts of one array each.

XLA's CPU sort is fast for one array of numbers (about 0.1 s for 2M
64-bit values on this machine's core) and several times slower as soon as
a payload rides along: ``jnp.argsort`` sorts the keys with their indices,
``jnp.lexsort`` two keys and the indices (0.56 and 0.71 s for 2M rows).
:func:`argsort` packs each row's key digit and its position into one
unsigned 64-bit word and sorts those alone: the position makes every word
unique, so the order is stable, and its low bits give the permutation back.
A key wider than what is left beside the position (64 minus the bits of a
position) is sorted a digit at a time, least significant first (LSD radix
passes): two passes for two words, one for a single word or for two whose
first one is narrow (``high_bits``) enough to fit.

The 64-bit words exist only inside this function (JAX's 64-bit types,
switched on for its body with ``jax.enable_x64``); inputs and outputs are
32-bit. GPUs sort one array of 64-bit integers natively too.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from distpm.ops import compact, running_sum


def _unsigned(word):
    """uint32 words that compare (unsigned) as ``word`` does (uint32, int32 or float32)."""
    if word.dtype == jnp.uint32:
        return word
    if word.dtype == jnp.int32:
        return lax.bitcast_convert_type(word, jnp.uint32) ^ jnp.uint32(1 << 31)
    if word.dtype == jnp.float32:  # IEEE order: flip all bits of negatives, the sign of the rest
        bits = lax.bitcast_convert_type(word, jnp.uint32)
        negative = (bits >> 31).astype(bool)
        return jnp.where(negative, ~bits, bits | jnp.uint32(1 << 31))
    raise TypeError(f"argsort sorts uint32, int32 or float32 words, got {word.dtype}")


def argsort(*words, distinct: bool = False, high_bits: int = 32):
    """Stable order (int32) of rows sorted by ``words``, the most significant first.

    words: one or two (n,) arrays of uint32, int32 or float32 (floats in
    IEEE order, -0 before +0; no NaN). Equal rows keep their order, as in
    ``jnp.lexsort(words[::-1])``.

    high_bits: with two words, the first one is uint32 below 2^high_bits (it
    is not checked); a key of high_bits + 32 bits that fits beside the
    position is sorted in one pass instead of two (e.g. a segment number and
    a float32 distance).

    distinct: a hint that rows seldom share their leading 64 - log2(n) key
    bits (e.g. the Morton keys of particles, with empty slots given distinct
    keys): the rows are then sorted by those bits alone, in one pass; rows
    that tie there (up to max(256, n / 64) of them, fewer past n = 2^24)
    are sorted apart by a small second sort, and if more tie, the whole
    key is sorted in two more passes. The result is the same either way.
    """
    if not 1 <= len(words) <= 2:
        raise ValueError(f"argsort takes one or two words, got {len(words)}")
    n = words[0].shape[0]
    if any(w.shape != (n,) for w in words):
        raise ValueError(f"words must all have shape ({n},), got {[w.shape for w in words]}")
    if not 0 <= high_bits <= 32:
        raise ValueError(f"high_bits must be in [0, 32], got {high_bits}")
    if high_bits < 32 and (len(words) != 2 or words[0].dtype != jnp.uint32):
        raise ValueError("high_bits < 32 needs two words, the first one uint32")
    if n <= 1:
        return jnp.zeros(n, jnp.int32)
    place = (n - 1).bit_length()  # bits of a position
    width = 64 - place  # bits of key per pass
    bits = 32 * len(words) - (32 - high_bits)
    words = [_unsigned(w) for w in words]
    with jax.enable_x64(True):
        key = words[0].astype(jnp.uint64)
        if len(words) == 2:
            key = (key << 32) | words[1].astype(jnp.uint64)
        position = jnp.arange(n, dtype=jnp.uint64)

        def by_digit(digit):  # stable order of the rows by digit (< 2^width)
            packed = lax.sort((digit << place) | position, is_stable=False)
            return (packed & jnp.uint64((1 << place) - 1)).astype(jnp.int32), packed >> place

        def radix():  # least significant digit first
            order = None
            for shift in range(0, bits, width):
                digit = key >> shift
                if shift + width < 64:
                    digit = digit & jnp.uint64((1 << width) - 1)
                step, _ = by_digit(digit if order is None else digit[order])
                order = step if order is None else order[step]
            return order

        if bits <= width or not distinct:
            return radix()
        order, lead = by_digit(key >> (bits - width))
        tie = lead[1:] == lead[:-1]
        no = jnp.zeros(1, bool)
        tied = jnp.concatenate([no, tie]) | jnp.concatenate([tie, no])  # sorted rows in a tie
        n_tied = jnp.sum(tied, dtype=jnp.int32)
        room = min(max(256, n // 64), 2 ** ((64 - place) // 2))
        fix = lambda: _untie(order, key, lead, tied, bits - width, room)  # noqa: E731
        return lax.switch(
            (n_tied > 0).astype(jnp.int32) + (n_tied > room), [lambda: order, fix, radix]
        )


def _untie(order, key, lead, tied, rest: int, room: int):
    """``order`` with its ``tied`` rows (at most ``room``; ``lead`` their leading bits, in
    sorted order) sorted within each run of equal ``lead`` by the key's ``rest`` last bits,
    stably (in x64 mode)."""
    n = order.shape[0]
    rows, _ = compact(tied, room)  # sorted positions of the tied rows, then n
    used = rows < n
    at = jnp.minimum(rows, n - 1)
    starts = (at == 0) | (lead[at] != lead[jnp.maximum(at - 1, 0)])
    run = running_sum(used & starts) - 1  # which run of ties
    t = (room - 1).bit_length()
    low = key[order[at]] & jnp.uint64((1 << rest) - 1)
    j = jnp.arange(room, dtype=jnp.uint64)
    run = jnp.where(used, run, room - 1).astype(jnp.uint64)
    packed = lax.sort((run << (rest + t)) | (low << t) | j, is_stable=False)
    pick = (packed & jnp.uint64((1 << t) - 1)).astype(jnp.int32)
    return order.at[jnp.where(used, rows, n)].set(order[at[pick]], mode="drop")
