"""Initial conditions: white noise, recovered input power, 2LPT against an analytic case."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REFERENCE
from jax.sharding import PartitionSpec as P
from scipy import stats

import distpm
from distpm import ic, kernels
from distpm.analysis import power
from distpm.parallel import Layout
from distpm.parallel.decomposition import FIELD, Decomposition

COSMO = distpm.Cosmology.planck18()


def test_white_noise_is_standard_normal_and_seeded():
    cfg = distpm.SimConfig(mesh_shape=32, parallel="1x1")
    w = np.asarray(distpm.white_noise(7, cfg))
    n = w.size
    assert abs(w.mean()) < 4 / np.sqrt(n)
    assert abs(w.std() - 1) < 4 / np.sqrt(2 * n)
    np.testing.assert_array_equal(w, distpm.white_noise(7, cfg))
    assert not np.allclose(w, distpm.white_noise(8, cfg))


def test_white_noise_takes_a_seed_a_key_or_the_configs_seed():
    """One noise for seed 7 given as an int, a numpy or jax integer, a typed or legacy PRNG key,
    None with cfg.seed = 7, or a seed traced by jit; other seeds are refused."""
    cfg = distpm.SimConfig(mesh_shape=8, seed=7, parallel="1x1")
    w = np.asarray(distpm.white_noise(7, cfg))
    same = (np.int64(7), jnp.int32(7), jax.random.key(7), jax.random.PRNGKey(7), None)
    for seed in same:
        np.testing.assert_array_equal(distpm.white_noise(seed, cfg), w, err_msg=repr(seed))
    np.testing.assert_array_equal(jax.jit(lambda s: distpm.white_noise(s, cfg))(7), w)
    for bad in (-1, 1.5, True, "7", jnp.zeros(3)):
        with pytest.raises(TypeError, match="seed must be an integer >= 0, a PRNG key or None"):
            distpm.white_noise(bad, cfg)


def _linear_field_power(cfg, seed):
    """Measured P of the linear field at a=1 and the theory averaged over the same modes."""
    edges = tuple(power.k_bin_edges(cfg))

    def local(noise):
        layout = Decomposition.of(cfg).lattice
        delta = layout.irfft3d(ic.linear_modes(noise, COSMO, layout, cfg))
        kmag = jnp.sqrt(kernels.k_squared(layout.wavenumbers(cfg.box_size, noise.dtype)))
        theory = distpm.linear_power(kmag, COSMO, 1.0)
        return delta, power.mode_sums(theory, layout, cfg.box_size, edges)

    delta, theory = Decomposition.of(cfg).sharded(local, (FIELD,), (FIELD, P()))(
        distpm.white_noise(seed, cfg)
    )
    k, p, n = distpm.power_spectrum(delta, cfg, compensate=False)
    p_theory = theory / np.maximum(power.mode_counts(cfg.mesh_shape, cfg.box_size, edges)[0], 1)
    return np.asarray(k), np.asarray(p), np.asarray(p_theory), np.asarray(n)


def test_fixed_amplitude_modes_recover_input_power_per_bin():
    cfg = distpm.SimConfig(box_size=200.0, mesh_shape=32, fixed_amplitude=True, parallel="2x2")
    _, p, p_theory, n = _linear_field_power(cfg, seed=3)
    filled = n > 0
    np.testing.assert_allclose(p[filled], p_theory[filled], rtol=1e-3)


def test_gaussian_modes_recover_input_power_within_cosmic_variance():
    """Each bin's power lies inside the 3-sigma-equivalent interval of cosmic variance.

    A bin averaging m = n/2 independent complex Gaussian modes has
    P_measured / P ~ Gamma(m, 1/m), which is far from Gaussian for the few
    modes of the first bins; the interval is its two-sided 99.73% range.
    """
    cfg = distpm.SimConfig(box_size=200.0, mesh_shape=32, parallel="1x1")
    _, p, p_theory, n = _linear_field_power(cfg, seed=4)
    filled = n > 0
    ratio, m = p[filled] / p_theory[filled], n[filled] / 2
    tail = stats.norm.sf(3.0)
    lo, hi = stats.gamma.ppf(tail, m, scale=1 / m), stats.gamma.isf(tail, m, scale=1 / m)
    assert np.all((ratio > lo) & (ratio < hi)), np.c_[ratio, lo, hi]
    # and the bins are not all shifted together: the mean ratio over many modes is 1
    mean_ratio = np.sum(ratio * m) / np.sum(m)
    assert abs(mean_ratio - 1) < 3 / np.sqrt(np.sum(m))


def test_lpt_of_two_crossed_plane_waves_matches_analytic(x64):
    """delta = A cos(kx) + B cos(ky): s1 and the 2LPT s2 are known in closed form."""
    box, n = 64.0, 16
    cfg = distpm.SimConfig(box_size=box, mesh_shape=n, dtype="float64", parallel="1x1")
    k = 2 * np.pi / box * 2
    amp_a, amp_b = 0.7, -0.4
    x, y, _ = np.meshgrid(*[np.arange(n) * box / n] * 3, indexing="ij")
    delta = amp_a * np.cos(k * x) + amp_b * np.cos(k * y)
    s1, s2, _ = ic.lpt_displacements(jnp.fft.rfftn(jnp.asarray(delta)), Layout((n,) * 3), cfg)
    want1 = np.stack([-amp_a * np.sin(k * x) / k, -amp_b * np.sin(k * y) / k, 0 * x], -1)
    prod = amp_a * amp_b / (2 * k)
    want2 = np.stack(
        [prod * np.sin(k * x) * np.cos(k * y), prod * np.cos(k * x) * np.sin(k * y), 0 * x], -1
    )
    np.testing.assert_allclose(s1, want1.reshape(-1, 3), atol=1e-10)
    np.testing.assert_allclose(s2, want2.reshape(-1, 3), atol=1e-10)


@pytest.mark.parametrize("order", [1, 2])
def test_lpt_momentum_follows_growth_rates(x64, order):
    cfg = distpm.SimConfig(
        box_size=128.0, mesh_shape=8, lpt_order=order, dtype="float64", a_start=0.2, parallel="1x1"
    )
    layout = Layout(cfg.particle_shape)
    modes = ic.linear_modes(distpm.white_noise(0, cfg), COSMO, layout, cfg)
    _, vel, _ = ic.lpt(modes, COSMO, layout, cfg)
    s1, s2, _ = ic.lpt_displacements(modes, layout, cfg)
    d1, f1 = distpm.growth_factor(0.2, COSMO), distpm.growth_rate(0.2, COSMO)
    e = distpm.background.E(0.2, COSMO)
    want = 0.2**2 * e * f1 * d1 * s1
    if order == 2:
        from distpm.background import growth, growth_table

        _, _, d2, f2 = growth(0.2, growth_table(COSMO))
        want = want + 0.2**2 * e * f2 * d2 * s2
    np.testing.assert_allclose(vel, want, rtol=1e-10, atol=1e-12)


def test_tabulated_power_file_drives_the_initial_conditions(tmp_path):
    """A k-P table (here CAMB's) replaces Eisenstein-Hu; fixed amplitudes recover it."""
    table = np.loadtxt(REFERENCE / "camb_planck18_z0.txt")
    path = tmp_path / "camb.txt"
    np.savetxt(path, table, header="k [h/Mpc]  P [(Mpc/h)^3]")
    cfg = distpm.SimConfig(
        box_size=200.0, mesh_shape=16, fixed_amplitude=True, linear_power=str(path), parallel="1x1"
    )
    layout = Layout(cfg.particle_shape)
    modes = ic.linear_modes(distpm.white_noise(0, cfg), COSMO, layout, cfg)
    k_f = 2 * np.pi / 200.0
    # one bin holding only the shell |k| = k_f (6 modes): its power is P_table(k_f),
    # up to the table's renormalisation to sigma8 (a 3e-4 change for this table)
    k, p, n = distpm.power_spectrum(
        layout.irfft3d(modes), cfg, compensate=False, k_min=0.5 * k_f, k_max=1.2 * k_f, n_bins=1
    )
    assert float(n[0]) == 6
    p_table = np.exp(np.interp(np.log(k_f), np.log(table[:, 0]), np.log(table[:, 1])))
    np.testing.assert_allclose(float(p[0]), p_table, rtol=1e-3)
    np.testing.assert_allclose(float(k[0]), k_f, rtol=1e-6)


def test_initial_conditions_need_about_a_steps_memory():
    """The initial conditions write each term into the particles' buffers as they make it
    (``ic.lpt``): on 4x2, XLA's plan of them is within 1.1 times the step's memory (1.27
    when they made every inverse FFT first and padded the particles afterwards, so that a
    2048^3 run did not fit eight 80 GB devices)."""
    from distpm import plan

    cfg = distpm.SimConfig(box_size=128.0, mesh_shape=64, parallel="4x2")
    per_particle = {}
    for name, (fn, args, kwargs) in plan._programs(COSMO, cfg, False).items():
        if name in ("initial_conditions", "step"):
            compiled = fn.lower(*args, **kwargs).compile()
            per_particle[name] = plan.program_memory(compiled, 0.0, cfg)["bytes_per_particle"]
    assert per_particle["initial_conditions"] <= 1.1 * per_particle["step"], per_particle
