"""What the kNN keeps of each row (:mod:`distpm.analysis.neighbours`): its k nearest
(squared distances and id words, (slots, k)), or, with a reduction, only the reduction's
result and whether the row's last pass found k; and three reductions.

A reduction is a function of (distances (m, k) [Mpc/h], ids (m, k, 2), velocities (m, k, 3))
of a block of m rows, returning arrays (m, ...) (or a pytree of them); it runs where a pass
has a block's k nearest at hand, so the (slots, k) lists never exist.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from distpm.parallel.layout import Layout


def fresh(answers, asking, reduce):
    """The rows' answers with those of the ``asking`` rows cleared: the k nearest lists
    (inf, -1), or, with a reduction, their flags of a complete answer."""
    if reduce is None:
        best_d2, best_id = answers
        best_d2 = jnp.where(asking[:, None], jnp.inf, best_d2)
        return best_d2, jnp.where(asking[:, None, None], -1, best_id)
    out, complete = answers
    return out, complete & ~asking


def answered(answers, k: int, reduce):
    """(cap,) whether each row's last answer found k within its reach."""
    return jnp.isfinite(answers[0][:, k - 1]) if reduce is None else answers[1]


def write(answers, rows, d2, node, node_ids, node_vel, k: int, reduce):
    """A block's k nearest, squared distances d2 and sorted nodes (block, k) (-1: none), into
    the answers of its ``rows``: the lists (distances and ids), or ``reduce``'s result of
    (distances, ids, velocities), so that the lists never exist for all rows. node_ids,
    node_vel: the nodes' id words and velocities, as columns (velocities: with a reduction)."""
    found = node >= 0
    at = jnp.where(found, node, 0)

    def of_nodes(columns, fill):
        x = jnp.stack([jnp.take(c, at, mode="clip") for c in columns], -1)
        return jnp.where(found[..., None], x, jnp.asarray(fill, x.dtype))

    ids = of_nodes(node_ids, -1)
    if reduce is None:
        best_d2, best_id = answers
        best_d2 = best_d2.at[rows].set(d2, mode="drop")
        return best_d2, best_id.at[rows].set(ids, mode="drop")
    out, complete = answers
    result = reduce(jnp.sqrt(d2), ids, of_nodes(node_vel, 0))
    out = jax.tree.map(lambda o, r: o.at[rows].set(r.astype(o.dtype), mode="drop"), out, result)
    return out, complete.at[rows].set(jnp.isfinite(d2[:, k - 1]), mode="drop")


def empty(cap: int, k: int, dtype, reduce):
    """The rows' answers before any pass: the k nearest lists (squared distances inf, ids
    -1), or zeros of ``reduce``'s result and no complete answer."""
    if reduce is None:
        best_d2 = jnp.full((cap, k), jnp.inf, dtype)
        return Layout.varying(best_d2, jnp.full((cap, k, 2), -1, jnp.int32))
    shapes = jax.eval_shape(
        reduce, *(jax.ShapeDtypeStruct((cap, k, *s), t) for s, t in
                  (((), dtype), ((2,), jnp.int32), ((3,), dtype)))
    )  # fmt: skip
    out = jax.tree.map(lambda x: Layout.varying(jnp.zeros(x.shape, x.dtype)), shapes)
    return out, Layout.varying(jnp.zeros(cap, bool))


def kth_distance(dist, ids, vel):
    """A ``reduce`` for :func:`knn`: [Mpc/h] the distance to the k-th nearest (m,)."""
    return dist[:, -1]


def mean_distance(dist, ids, vel):
    """A ``reduce`` for :func:`knn`: [Mpc/h] the mean distance to the k nearest (m,)."""
    return jnp.mean(dist, axis=1)


def mean_velocity(dist, ids, vel):
    """A ``reduce`` for :func:`knn`: the mean velocity of the k nearest (m, 3), in the units
    of ``particles.vel``."""
    return jnp.mean(vel, axis=1)
