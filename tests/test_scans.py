"""Running sums and maxima against numpy's, and the minimum image against float64."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from distpm.analysis.links import periodic_d2
from distpm.scans import running_max, running_sum


@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_running_sum_and_max_equal_numpy(n):
    rng = np.random.default_rng(n)
    flags = rng.random(n) < 0.3
    ints = rng.integers(-(2**20), 2**20, (n, 3)).astype(np.int32)
    got = jax.jit(running_sum)(jnp.asarray(flags))
    assert got.dtype == jnp.int32
    np.testing.assert_array_equal(got, np.cumsum(flags))
    np.testing.assert_array_equal(running_sum(jnp.asarray(flags), jnp.int32), np.cumsum(flags))
    np.testing.assert_array_equal(jax.jit(running_sum)(ints), np.cumsum(ints, axis=0))
    grid = jnp.asarray(ints > 0)  # bools in 2-D: counts down the first axis
    np.testing.assert_array_equal(running_sum(grid), np.cumsum(ints > 0, axis=0))
    np.testing.assert_array_equal(jax.jit(running_max)(ints), np.maximum.accumulate(ints, axis=0))


def test_minimum_image_across_the_faces():
    """Pairs near opposite faces, near the same face and far apart, on a box that is not a cube:
    float32 squared distances within 5e-7 of the float64 minimum image of the same points."""
    box = (100.0, 60.0, 30.0)
    rng = np.random.default_rng(0)
    a = rng.uniform(0, 1, (5000, 3)) * box
    b = np.where(
        rng.random((5000, 3)) < 0.5,
        rng.uniform(-1, 1, (5000, 3)),
        rng.uniform(0, 1, (5000, 3)) * box,
    )
    b = np.mod(a + b, box)  # some near a across the faces, some anywhere
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    got = periodic_d2(list(jnp.asarray(a32).T), list(jnp.asarray(b32).T), box)
    d = a32.astype(np.float64) - b32
    d -= np.asarray(box) * np.round(d / box)
    want = np.sum(d * d, axis=1)
    np.testing.assert_allclose(got, want, rtol=5e-7, atol=1e-10)
