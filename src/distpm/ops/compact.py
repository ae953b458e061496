"""Compaction: the slots of the rows to keep, kept rows first, in order.

The form differs by platform (:mod:`distpm.ops.platform`):

- CPU: rows are ranked a block at a time (``lax.scan``), so the int32 ranks
  never exist for all rows at once (on a large buffer they would cost 4
  bytes per slot for every compaction of a step), and rows not kept are
  written to one spare slot, cut off at the end: XLA's CPU scatter runs 2
  times slower where out-of-range indices mix with the others (2^18 rows,
  30% kept; ``benchmarks/halos.md``).
- GPU: one running sum over all rows and one scatter that drops the rows not
  kept. A serial scan over blocks would be thousands of dependent launches
  per step on a large buffer, and a spare slot that every rejected row
  writes is one address under contention from every thread.

Both give the same integers.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
from jax import lax

from distpm.ops.platform import by_platform
from distpm.ops.scans import running_sum

# on the CPU, rows are ranked in blocks of 1/COMPACT_BLOCKS of them, at most COMPACT_BLOCK
COMPACT_BLOCK, COMPACT_BLOCKS = 2**16, 8


def compact(valid, size: int, block: int | None = None):
    """Source row for each of ``size`` output slots, valid rows first in order; count of valid.

    valid: (n,) bool. Returns ``(source, count)``: ``source`` (size,) int32 holds
    the rows of the first ``min(count, size)`` valid rows in order and ``n``
    after them; ``count`` is the number of valid rows (it may exceed ``size``:
    the caller checks). ``block``: on the CPU, how many rows each step of the
    scan ranks (default 1/COMPACT_BLOCKS of them, at most COMPACT_BLOCK); where
    the rows are a working set already bounded, larger blocks save time. The
    GPU form ranks all rows at once and ignores it.
    """
    if block is not None and block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    return by_platform(
        valid,
        cpu=functools.partial(compact_cpu, size=size, block=block),
        gpu=functools.partial(compact_gpu, size=size),
    )


def compact_cpu(valid, size: int, block: int | None = None):
    """The CPU form of :func:`compact`: a scan over blocks, the rest to a spare slot."""
    n = valid.shape[0]
    block = max(1, min(n, block or min(COMPACT_BLOCK, -(-n // COMPACT_BLOCKS))))
    n_blocks = -(-n // block)
    blocks = jnp.pad(valid, (0, n_blocks * block - n)).reshape(n_blocks, block)
    zero = jnp.sum(valid[:0], dtype=jnp.int32)  # typed like valid (per device inside shard_map)

    def body(carry, xs):
        source, count = carry
        v, start = xs
        target = jnp.where(v, jnp.minimum(count + running_sum(v, jnp.int32) - 1, size), size)
        rows = start + jnp.arange(block, dtype=jnp.int32)
        source = source.at[target].set(rows)  # all in range: slot ``size`` takes the rest
        return (source, count + jnp.sum(v, dtype=jnp.int32)), None

    starts = jnp.arange(n_blocks, dtype=jnp.int32) * block
    source = jnp.full(size + 1, n, jnp.int32) + zero
    (source, count), _ = lax.scan(body, (source, zero), (blocks, starts))
    return source[:size], count


def compact_gpu(valid, size: int):
    """The GPU form of :func:`compact`: one running sum, one scatter that drops the rest.

    Every row gets a target of its own (the rows not kept: ``size`` + row, out of
    range and dropped), so the scatter has unique indices: no two threads write
    one address, and XLA's deterministic mode leaves it as it is.
    """
    n = valid.shape[0]
    rank = running_sum(valid, jnp.int32) - 1
    rows = jnp.arange(n, dtype=jnp.int32)
    unique = size + n < 2**31  # the targets past ``size`` stay int32
    spare = size + rows if unique else size
    target = jnp.where(valid & (rank < size), rank, spare)
    source = jnp.full(size, n, jnp.int32) + jnp.sum(valid[:0], dtype=jnp.int32)
    source = source.at[target].set(rows, mode="drop", unique_indices=unique)
    return source, jnp.sum(valid, dtype=jnp.int32)
