"""Upper bounds on each particle's k-th neighbour distance, from its places in Morton order.

Any k other particles bound the distance to the k-th nearest: it is at most
the largest of their distances. Particles within a few places of each other
in Morton (z-) order are mostly close in space, so the k-th nearest of the
2 _WINDOW particles around a particle's place gives a bound that is often
tight. The order has seams (neighbours in space far apart in the order), so
three orders are used, of the box shifted by 0, 1/3 and 2/3 of its sides,
and the smallest bound kept. The shifts must not be dyadic: a shift by 1/4
or 1/2 of the box moves the seams onto seams, and orders shifted by 0, 1/4,
1/2 and 3/4 bound no better than one. On 128^3 PM particles (256 Mpc/h), k
= 8, the ball of the bound holds 1.21 times the volume of the k-th
neighbour's on average (median 1.03; 1.26 and 1.13 for 10^6 uniform
points; with one order, 3.7). The bounds
loosen as k nears _WINDOW (mean 1.55 at k = 16 on PM particles, 1.66 on
uniform points), so they are given only for k <= _WINDOW: for larger k
every bound is inf, and the kNN sweeps its passes as before the bounds.

The bounds need no communication: each device orders its own particles, so
particles near its faces get looser bounds, never wrong ones. They cost a
sort of one 64-bit word per order up to 2^22 slots, of two above
(:func:`distpm.ops.sorting.argsort`), and arithmetic that fuses into
one loop per order.
"""

from __future__ import annotations

import jax.numpy as jnp

from distpm.analysis import links, morton
from distpm.ops import sorting

_BITS = 14  # per axis: 42-bit keys, which sort in one pass beside a position of up to 22 bits
_WINDOW = 20  # places on each side of a particle in each order
_SHIFTS = ((0.0, 0.0, 0.0), (1 / 3, 1 / 3, 1 / 3), (2 / 3, 2 / 3, 2 / 3))  # of the box's sides


def lowest(values, k: int):
    """The k-th smallest of ``values`` (a list of arrays of one shape), elementwise: each is
    inserted into a sorted list of the k smallest so far, by minima and maxima (no sort)."""
    best = [jnp.full(values[0].shape, jnp.inf, values[0].dtype)] * k
    for v in values:
        for i in range(k):
            best[i], v = jnp.minimum(best[i], v), jnp.maximum(best[i], v)
    return best[-1]


def kth_bound2(pos, mask, box_size, k: int):
    """(n,) squared upper bounds [(Mpc/h)^2] on the distance from each particle to its k-th
    nearest other one: in each Morton order, the k-th nearest of the particles within
    ``_WINDOW`` places of it, and the smallest of the three; inf where fewer than k are valid,
    and everywhere for k > ``_WINDOW``.

    pos (n, 3) [Mpc/h] global positions, wrapped into the box; mask (n,) which slots hold
    particles. Distances are periodic minimum images, as
    :func:`distpm.analysis.links.periodic_d2` computes them.
    """
    out = jnp.full(mask.shape, jnp.inf, pos.dtype)
    box = jnp.asarray(box_size, pos.dtype)
    n = mask.shape[0]
    w = min(_WINDOW, (n - 1) // 2)  # places that are all distinct slots, none the particle's own
    if 2 * w < k or k > _WINDOW:
        return out
    for shift in _SHIFTS:
        keys = morton.morton_keys(pos + jnp.asarray(shift, pos.dtype) * box, box_size, bits=_BITS)
        high, low = keys[:, 0], keys[:, 1]
        high = jnp.where(mask, high, jnp.uint32(1023))  # empty slots last (largest key)
        low = jnp.where(mask, low, jnp.uint32(0xFFFFFFFF))
        order = sorting.argsort(high, low, high_bits=10)
        near, valid = links.columns(pos[order]), mask[order]
        ring = lambda x: jnp.concatenate([x[-w:], x, x[:w]])  # noqa: E731  (w each side)
        near_ring, valid_ring = [ring(x) for x in near], ring(valid)
        d2 = []
        for o in [*range(-w, 0), *range(1, w + 1)]:  # slices of the ring: fused, no copies
            other = [x[w + o : w + o + n] for x in near_ring]
            both = valid & valid_ring[w + o : w + o + n]
            d2.append(jnp.where(both, links.periodic_d2(near, other, box_size), jnp.inf))
        out = jnp.minimum(out, jnp.zeros_like(out).at[order].set(lowest(d2, k)))
    return out
