"""Local operations: running sums and maxima and compaction against numpy's, each in its CPU
and its GPU form (both run here: :mod:`distpm.ops.platform`), and the minimum image against
float64; named overflow checked on the host and inside a compiled program."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from distpm.analysis.links import periodic_d2
from distpm.ops import compact, running_max, running_sum
from distpm.ops.compact import compact_cpu, compact_gpu
from distpm.ops.platform import by_platform
from distpm.ops.scans import running_max_cpu, running_max_gpu, running_sum_cpu, running_sum_gpu
from distpm.parallel import overflow


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


@pytest.mark.parametrize("n", [1, 7, 1000, 4099])
def test_the_gpu_forms_of_the_scans_equal_the_cpu_forms(n):
    """Bitwise on integers; floats (sums in another order) to 1e-6 of the largest."""
    rng = np.random.default_rng(n)
    ints = jnp.asarray(rng.integers(-(2**20), 2**20, (n, 3)).astype(np.int32))
    floats = jnp.asarray(rng.normal(size=(n, 2)).astype(np.float32))
    np.testing.assert_array_equal(jax.jit(running_sum_gpu)(ints), jax.jit(running_sum_cpu)(ints))
    np.testing.assert_array_equal(jax.jit(running_max_gpu)(ints), jax.jit(running_max_cpu)(ints))
    np.testing.assert_array_equal(running_max_gpu(floats), running_max_cpu(floats))
    cpu, gpu = running_sum_cpu(floats), running_sum_gpu(floats)
    np.testing.assert_allclose(gpu, cpu, rtol=0, atol=1e-6 * float(jnp.max(jnp.abs(cpu))))


def test_by_platform_runs_the_form_of_the_platform():
    """The CPU form on the CPU, the GPU form on a GPU (DISTPM_TEST_PLATFORM=cuda)."""
    chosen = jax.jit(lambda x: by_platform(x, cpu=lambda v: v * 2, gpu=lambda v: v * 3))
    assert int(chosen(jnp.int32(5))) == (10 if jax.default_backend() == "cpu" else 15)


def test_running_max_of_bools_says_whether_any_so_far():
    flags = np.array([False, False, True, False, True])
    got = jax.jit(running_max)(jnp.asarray(flags))
    assert got.dtype == jnp.bool_
    np.testing.assert_array_equal(got, np.logical_or.accumulate(flags))


@pytest.mark.parametrize(("n", "kept", "size", "block"), [
    (1, 1.0, 1, None), (1000, 0.3, 500, None), (1000, 0.3, 200, None), (1000, 0.9, 1000, 7),
    (4099, 0.5, 3000, 4099), (4099, 0.0, 10, None), (2**17 + 3, 0.4, 2**16, None),
])  # fmt: skip
def test_compact_in_both_forms_equals_numpy(n, kept, size, block):
    """The first ``size`` valid rows in order, ``n`` after them, and the count of all valid rows
    (past ``size`` too): the CPU form for several block sizes and the GPU form, bitwise."""
    valid = np.random.default_rng(n).random(n) < kept
    rows = np.flatnonzero(valid)[:size]
    want = np.concatenate([rows, np.full(size - len(rows), n)]).astype(np.int32)
    results = {
        "chosen": jax.jit(compact, static_argnums=(1, 2))(jnp.asarray(valid), size, block),
        "cpu": jax.jit(compact_cpu, static_argnums=(1, 2))(jnp.asarray(valid), size, block),
        "gpu": jax.jit(compact_gpu, static_argnums=1)(jnp.asarray(valid), size),
    }
    for name, (source, count) in results.items():
        assert source.dtype == jnp.int32 and count.dtype == jnp.int32, name
        np.testing.assert_array_equal(source, want, err_msg=name)
        assert int(count) == int(valid.sum()), name


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


def test_named_overflow_names_every_option_to_raise_and_by_how_much():
    limits = {
        "capacity": overflow.Limit(
            100, "needed {need} slots but has {have}", "capacity_factor", 1.5, per_unit=64.0
        ),
        "ghosts": overflow.Limit(
            (10, 20, 30),
            "ghosts: {need} > {have}",
            "ghost_factor",
            0.3,
            per_unit=(10 / 0.3, 20 / 0.3, 30 / 0.3),
        ),
        "pairs": overflow.Limit(1, "too many pairs", advice="use a shorter linking length"),
        "records": overflow.Limit(64, "records {need} > {have}", "ghost_factor", 0.3, 64 / 0.3),
        "spare": overflow.Limit(50, "spare {need} > {have}", "spare_factor", 1.0),
    }
    needs = overflow.most(
        {"capacity": jnp.int32(90), "ghosts": jnp.array([3, 25, 4])},
        {"capacity": jnp.int32(130), "pairs": jnp.int32(2), "spare": jnp.int32(7)},
        {"records": jnp.int32(200)},
    )
    np.testing.assert_array_equal(needs["ghosts"], [3, 25, 4])  # kept where one stage lacks it
    assert int(needs["capacity"]) == 130
    with pytest.raises(overflow.CapacityError) as err:
        overflow.check(needs, limits)
    lines = str(err.value).splitlines()
    assert lines == [
        "needed 130 slots but has 100 (capacity_factor=1.5); "
        "raise capacity_factor to at least 2.04",
        "ghosts: 25 > 20 (ghost_factor=0.3); raise ghost_factor to at least 0.938",
        "too many pairs; use a shorter linking length",
        "records 200 > 64 (ghost_factor=0.3); raise ghost_factor to at least 0.938",
    ]  # 130 / 64 = 2.03125 rounded up to 3 digits; ghost_factor: the larger of 25 * 0.3 / 20
    # = 0.375 and 200 * 0.3 / 64 = 0.9375 for both of its buffers; "spare" fits
    overflow.check({"capacity": np.int32(100), "spare": 50}, limits)  # full is not too full
    with pytest.raises(KeyError, match="halos"):
        overflow.check({"halos": 1}, limits)


def test_named_overflow_raises_on_the_host_and_poisons_inside_jit():
    limit = {
        "capacity": overflow.Limit(
            4,
            "needed {need} slots but has {have}",
            "capacity_factor",
            1.0,
            per_unit=lambda need: float(need) / 4 + 0.25,  # not linear: a function
        )
    }

    def fill(n):
        out = (jnp.asarray(n, jnp.float32) + 0.5, jnp.asarray(n) + 1)  # a float and an int
        return overflow.checked(out, {"capacity": n}, limit)

    # concrete needs (a program has run): the check raises on the host, with the remedy
    assert fill(jnp.int32(4))[1] == 5
    with pytest.raises(
        overflow.CapacityError,
        match=r"needed 6 slots but has 4 \(capacity_factor=1.0\); "
        r"raise capacity_factor to at least 1.75",
    ):
        fill(jnp.int32(6))
    # traced needs: no host callback in the program (it could not compile for a GPU
    # without one); an overflow makes the float results NaN, never silently wrong
    jitted = jax.jit(fill)
    assert "callback" not in jitted.lower(jnp.int32(4)).as_text()
    value, count = jitted(jnp.int32(4))
    assert float(value) == 4.5 and int(count) == 5
    value, count = jitted(jnp.int32(6))
    assert np.isnan(float(value)) and int(count) == 7
    with pytest.raises(KeyError, match="halos"):
        jax.jit(lambda n: overflow.checked(n, {"halos": n}, limit))(jnp.int32(1))
