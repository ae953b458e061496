"""The packed 64-bit argsort against numpy's stable sorts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from distpm.ops.sorting import argsort

sort = jax.jit(argsort)


@pytest.mark.parametrize("n", [1, 2, 5, 1000, 4097])
def test_two_words_sort_like_a_stable_lexsort(n):
    """Many ties (so stability shows), negative int32 words and full-range uint32 words."""
    rng = np.random.default_rng(n)
    small = rng.integers(-5, 5, n).astype(np.int32)
    wide = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    wide[::3] = wide[0]
    few = (wide % 7).astype(np.uint32)
    for high, low in ((small, few), (wide, small), (few, wide), (wide, few)):
        got = np.asarray(sort(jnp.asarray(high), jnp.asarray(low)))
        np.testing.assert_array_equal(got, np.lexsort((low, high)))


@pytest.mark.parametrize("high_bits", [1, 13, 31])
def test_a_narrow_first_word_sorts_like_a_stable_lexsort(high_bits):
    """Segment numbers below 2^high_bits and float32 distances (one pass when they fit)."""
    rng = np.random.default_rng(high_bits)
    n = 5000
    high = np.sort(rng.integers(0, 2**high_bits, n, dtype=np.uint64)).astype(np.uint32)
    high[-3:] = 2**high_bits - 1
    low = rng.exponential(size=n).astype(np.float32)
    low[::5] = low[0]  # ties
    got = jax.jit(lambda h, lo: argsort(h, lo, high_bits=high_bits))(high, low)
    np.testing.assert_array_equal(np.asarray(got), np.lexsort((low, high)))
    with pytest.raises(ValueError, match="uint32"):
        argsort(high.astype(np.int32), low, high_bits=high_bits)
    with pytest.raises(ValueError, match="in \\[0, 32\\]"):
        argsort(high, low, high_bits=-1)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.float32])
def test_one_word_sorts_like_a_stable_argsort(dtype):
    rng = np.random.default_rng(2)
    if dtype == np.float32:
        word = rng.normal(size=3001).astype(dtype)
        word[::4] = word[1]  # ties
        word[::9] = np.inf
        word[5] = -np.inf
    else:
        info = np.iinfo(dtype)
        word = rng.integers(info.min, info.max, 3001, dtype=np.int64, endpoint=True).astype(dtype)
        word[::4] = word[1]
        word[:2] = [info.min, info.max]
    got = np.asarray(sort(jnp.asarray(word)))
    np.testing.assert_array_equal(got, np.argsort(word, kind="stable"))


def test_negative_zero_sorts_before_positive_zero():
    word = np.array([0.0, -0.0, 1.0, -1.0, -0.0], np.float32)
    np.testing.assert_array_equal(np.asarray(sort(jnp.asarray(word))), [3, 1, 4, 0, 2])


def test_other_inputs_are_refused():
    with pytest.raises(TypeError, match="int64|float16"):
        argsort(jnp.zeros(4, jnp.float16))
    with pytest.raises(ValueError, match="one or two"):
        argsort(*[jnp.zeros(4, jnp.int32)] * 3)
    with pytest.raises(ValueError, match="shape"):
        argsort(jnp.zeros(4, jnp.int32), jnp.zeros(5, jnp.int32))


@pytest.mark.parametrize("tied", [0, 2, 7, 300, 3000])
def test_the_distinct_hint_changes_nothing(tied):
    """Keys distinct in their leading bits (one pass), a few tied there (the ties sorted
    apart) and many tied (more than the 256 the one-pass path mends: the full sort)."""
    n = 4000  # 12 bits of position: keys tie in their leading bits when only the last 12 differ
    rng = np.random.default_rng(tied)
    high = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    low = rng.integers(0, 2**32, n, dtype=np.uint64).astype(np.uint32)
    rows = rng.choice(n, tied, replace=False)
    runs = rows[: (tied + 2) // 3]  # runs of about three rows share their leading bits
    high[rows] = high[np.resize(runs, tied)]
    low[rows] = (low[np.resize(runs, tied)] & ~np.uint32(0xFFF)) | rng.integers(0, 8, tied)
    lead = (high.astype(np.uint64) << 32 | low) >> 12
    assert (np.sort(lead)[1:] == np.sort(lead)[:-1]).sum() >= tied * 2 // 3
    got = jax.jit(lambda h, lo: argsort(h, lo, distinct=True))(jnp.asarray(high), jnp.asarray(low))
    np.testing.assert_array_equal(np.asarray(got), np.lexsort((low, high)))
