"""Power spectrum estimator: exact values on known fields, mode counting."""

import math

import jax.numpy as jnp
import numpy as np
import pytest

import distpm
from distpm.analysis.power import bin_index, k_bin_edges

CFG = distpm.SimConfig(box_size=(100.0, 100.0, 50.0), mesh_shape=(16, 16, 8))


def _grid():
    axes = [np.arange(n) * b / n for n, b in zip(CFG.mesh_shape, CFG.box_size, strict=True)]
    return np.meshgrid(*axes, indexing="ij")


def test_plane_wave_power_is_exact():
    x, _, _ = _grid()
    amp, k0 = 0.3, 2 * np.pi / 100.0 * 3
    delta = jnp.asarray(amp * np.cos(k0 * x), jnp.float32)
    k, p, n = distpm.power_spectrum(delta, CFG, compensate=False)
    i = int(np.argmin(np.abs(np.asarray(k) - k0)))
    # two modes (+k0, -k0) carry V amp^2 / 4 each, averaged over the bin's modes
    expected = math.prod(CFG.box_size) * amp**2 / 4 * 2 / float(n[i])
    np.testing.assert_allclose(float(p[i]), expected, rtol=1e-5)
    others = np.delete(np.asarray(p), i)
    assert np.all(np.abs(others) < 1e-6 * expected)


def test_cross_power_of_field_with_itself_and_its_negative():
    rng = np.random.default_rng(0)
    delta = jnp.asarray(rng.normal(size=CFG.mesh_shape), jnp.float32)
    _, auto, _ = distpm.power_spectrum(delta, CFG)
    _, cross, _ = distpm.power_spectrum(delta, CFG, other=delta)
    _, anti, _ = distpm.power_spectrum(delta, CFG, other=-delta)
    np.testing.assert_allclose(cross, auto, rtol=1e-6)
    np.testing.assert_allclose(anti, -auto, rtol=1e-6)


def test_every_mode_is_counted_once():
    delta = jnp.zeros(CFG.mesh_shape, jnp.float32)
    k_corner = float(
        np.sqrt(
            sum((np.pi * n / b) ** 2 for n, b in zip(CFG.mesh_shape, CFG.box_size, strict=True))
        )  # noqa: E501
    )
    _, _, n = distpm.power_spectrum(delta, CFG, k_min=1e-3, k_max=1.001 * k_corner, n_bins=7)
    assert float(n.sum()) == math.prod(CFG.mesh_shape) - 1  # all modes but k = 0


def test_white_noise_power_is_flat_at_its_expected_level():
    rng = np.random.default_rng(1)
    delta = jnp.asarray(rng.normal(size=CFG.mesh_shape), jnp.float32)
    _, p, n = distpm.power_spectrum(delta, CFG, compensate=False, n_bins=4)
    cell_volume = math.prod(CFG.cell_size)  # P = V / N_cells for unit-variance noise
    sigma = cell_volume * np.sqrt(2 / np.asarray(n))
    assert np.all(np.abs(np.asarray(p) - cell_volume) < 4 * sigma)


def test_log_bins_and_bad_range():
    edges = k_bin_edges(CFG, log=True, n_bins=5)
    assert len(edges) == 6 and np.allclose(np.diff(np.log(edges)), np.log(edges[1] / edges[0]))
    with pytest.raises(ValueError, match="k_min < k_max"):
        k_bin_edges(CFG, k_min=1.0, k_max=0.5)
    with pytest.raises(ValueError, match="expected mesh_shape"):
        distpm.power_spectrum(jnp.zeros((4, 4, 4)), CFG)


@pytest.mark.parametrize("kind", ["linear", "log", "irregular"])
def test_bin_index_is_digitize_on_and_between_the_edges(kind):
    edges = {
        "linear": k_bin_edges(CFG),
        "log": k_bin_edges(CFG, log=True, n_bins=9),
        "irregular": np.array([0.05, 0.1, 0.11, 0.4, 0.9]),
    }[kind]
    e32 = edges.astype(np.float32)
    rng = np.random.default_rng(2)
    x = np.concatenate([
        rng.uniform(-0.1, 1.3 * edges[-1], 100_000),
        e32, np.nextafter(e32, -np.inf), np.nextafter(e32, np.inf), [0.0, np.inf],
    ]).astype(np.float32)  # fmt: skip
    want = np.digitize(x, e32) - 1  # in float32, as the device compares
    np.testing.assert_array_equal(np.asarray(bin_index(jnp.asarray(x), tuple(edges))), want)
    with pytest.raises(ValueError, match="must increase"):
        bin_index(jnp.asarray(x), (0.1, 0.1, 0.2))
