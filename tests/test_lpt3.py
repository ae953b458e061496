"""3LPT: its displacement solves the Lagrangian equations of motion to third order,
matches a closed form, is the same on every device grid, and has exact gradients.

The equations (Einstein-de Sitter, time D = a, x = q + Psi(q, D)): with F = I + grad Psi,
J = det F, the operator T = d^2/dlnD^2 + 1/2 d/dlnD and A = grad(T Psi),
  divergence:  sum_ij cof(F)_ij A_ij = 3/2 (J - 1)    (Poisson's equation times J)
  curl:        F^T A is symmetric                     (no vorticity in x)
Expanding Psi = sum_n D^n psi_n, T acts on D^n as n^2 + n/2, and each equation must
hold order by order; here up to D^3.
"""

import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import distpm
from distpm import ic
from distpm.background import growth3, growth_table
from distpm.parallel import Layout

COSMO = distpm.Cosmology.planck18()
EDS = distpm.Cosmology(Omega_c=0.95, Omega_b=0.05, h=0.7, n_s=1.0, sigma8=0.8)
# Einstein-de Sitter growth factors at D1 = 1: D2 = -3/7, D3a = -1/3, D3b = 5/21, D3c = 1/7
EDS_D2, EDS_D3 = -3.0 / 7.0, (-1.0 / 3.0, 5.0 / 21.0, 1.0 / 7.0)

LEVI_CIVITA = np.zeros((3, 3, 3))
for _i, _j, _k in itertools.permutations(range(3)):
    LEVI_CIVITA[_i, _j, _k] = np.linalg.det(np.eye(3)[[_i, _j, _k]])
EPS2 = np.einsum("ikl,jmn->ijklmn", LEVI_CIVITA, LEVI_CIVITA)


def _band_limited_delta(n, box, seed, m_max=2):
    """A random real field with wave numbers |m_i| <= m_max per axis: its products up to
    third order stay below the grid's Nyquist frequency, so grid derivatives are exact."""
    rng = np.random.default_rng(seed)
    modes = np.zeros((n, n, n), complex)
    for m in itertools.product(range(-m_max, m_max + 1), repeat=3):
        if m != (0, 0, 0):
            modes[m] = rng.normal() + 1j * rng.normal()
    return np.fft.ifftn(modes).real * n**3 * 0.02 / m_max**3


def _displacements(delta, box):
    """distpm's (s1, s2, (s3a, s3b, s3c)) for this linear density, one device, float64."""
    n = delta.shape[0]
    cfg = distpm.SimConfig(box_size=box, mesh_shape=n, lpt_order=3, dtype="float64", parallel="1x1")
    return ic.lpt_displacements(jnp.fft.rfftn(jnp.asarray(delta)), Layout((n,) * 3), cfg)


def _jacobian(field, box):
    """grad of a (N, 3) vector field on an n^3 grid: (3, 3, n^3) with [i, j] = d_j field_i."""
    n = round(field.shape[0] ** (1 / 3))
    k = 2 * np.pi * np.fft.fftfreq(n, box / n)
    kvec = np.meshgrid(k, k, k[: n // 2 + 1], indexing="ij")
    out = np.empty((3, 3, n**3))
    for i in range(3):
        fk = np.fft.rfftn(np.asarray(field)[:, i].reshape(n, n, n))
        for j in range(3):
            out[i, j] = np.fft.irfftn(1j * kvec[j] * fk, s=(n, n, n), axes=(0, 1, 2)).reshape(-1)
    return out


def _residuals(orders, box):
    """Coefficients of D^1..D^3 of the divergence and curl equations (module doc), for
    Psi = sum_n D^n orders[n-1]; returned with the size of their largest term."""
    m = {n + 1: _jacobian(psi, box) for n, psi in enumerate(orders)}
    t = {n: (n * n + n / 2) * mat for n, mat in m.items()}

    def tr(x):
        return np.einsum("ii...->...", x)

    def compositions(total, parts):
        return [c for c in itertools.product(m, repeat=parts) if sum(c) == total]

    div, curl, scale = {}, {}, {}
    for order in (1, 2, 3):
        terms = [tr(t[order]), -1.5 * tr(m[order])]
        for p, q in compositions(order, 2):
            terms += [tr(m[p]) * tr(t[q]), -np.einsum("ji...,ij...->...", m[p], t[q])]
            terms += [-0.75 * (tr(m[p]) * tr(m[q]) - np.einsum("ij...,ji...->...", m[p], m[q]))]
        for p, q, r in compositions(order, 3):  # cof(M) : T and det(M)
            # EPS2[i, j, k, l, m, n] = eps_ikl eps_jmn: cof(M)_ij = 1/2 EPS2 M_km M_ln and
            # det M = 1/6 EPS2 M_ij M_km M_ln; Poisson's side carries -3/2
            cof = np.einsum("ijklmn,km...,ln...->ij...", EPS2, m[p], m[q], optimize=True)
            terms += [0.5 * np.einsum("ij...,ij...->...", cof, t[r])]
            terms += [-0.25 * np.einsum("ij...,ij...->...", cof, m[r])]
        div[order] = sum(terms)
        a = t[order] + sum(
            np.einsum("li...,lj...->ij...", m[p], t[q]) for p, q in compositions(order, 2)
        )
        curl[order] = a - np.swapaxes(a, 0, 1)
        scale[order] = max(np.max(np.abs(x)) for x in terms)
    return div, curl, scale


def test_third_order_growth_factors_in_einstein_de_sitter_and_lcdm(x64):
    a = np.geomspace(1e-3, 2.0, 9)
    for (d, d_prime), c in zip(growth3(a, growth_table(EDS, order=3)), EDS_D3, strict=True):
        np.testing.assert_allclose(d, c * a**3, rtol=1e-6)
        np.testing.assert_allclose(d_prime, 3 * c * a**3, rtol=1e-6)
    # LCDM against the fits of Bouchet et al. (1995), D3a ~ -1/3 Om^(-4/275) D1^3 and
    # D3b ~ 5/21 Om^(-269/17875) D1^3 (their D3b is twice ours), good to ~1e-3
    a = np.array([0.1, 0.5, 1.0])
    table = growth_table(COSMO, order=3)
    d1 = distpm.background.growth(a, table)[0]
    om = np.asarray(distpm.background.Omega_m_of_a(a, COSMO))
    (d3a, _), (d3b, _), (d3c, _) = growth3(a, table)
    np.testing.assert_allclose(d3a, -1 / 3 * om ** (-4 / 275) * d1**3, rtol=2e-3)
    np.testing.assert_allclose(d3b, 5 / 21 * om ** (-269 / 17875) * d1**3, rtol=2e-3)
    assert np.all(d3c > 1 / 7 * d1**3 * 0.99)  # dark energy slows D1 more than D3c
    with pytest.raises(ValueError, match="order=3"):
        growth3(a, growth_table(COSMO))


def test_3lpt_solves_the_equations_of_motion_to_third_order(x64):
    box = 100.0
    s1, s2, s3 = _displacements(_band_limited_delta(16, box, seed=0), box)
    third = sum(c * s for c, s in zip(EDS_D3, s3, strict=True))
    div, curl, scale = _residuals([s1, EDS_D2 * s2, third], box)
    for order in (1, 2, 3):
        assert np.max(np.abs(div[order])) < 1e-10 * scale[order], order
        assert np.max(np.abs(curl[order])) < 1e-10 * scale[order], order
    # each third-order term is needed: without it, or with 2LPT alone, order 3 fails
    for dropped in range(3):
        partial = sum(
            c * s for n, (c, s) in enumerate(zip(EDS_D3, s3, strict=True)) if n != dropped
        )
        div, curl, scale = _residuals([s1, EDS_D2 * s2, partial], box)
        worst = max(np.max(np.abs(div[3])), np.max(np.abs(curl[3])))
        assert worst > 1e-2 * scale[3], dropped


def test_3lpt_of_two_crossed_plane_waves_matches_the_closed_form(x64):
    """delta = A cos(kx) + B cos(ky): det(phi1_ij) = 0, so s3a = 0, and s3b, s3c in closed form."""
    box, n = 64.0, 16
    k = 2 * np.pi / box * 2
    amp_a, amp_b = 0.7, -0.4
    x, y, _ = (g.reshape(-1) for g in np.meshgrid(*[np.arange(n) * box / n] * 3, indexing="ij"))
    delta = amp_a * np.cos(k * x) + amp_b * np.cos(k * y)
    _, _, (s3a, s3b, s3c) = _displacements(delta.reshape(n, n, n), box)
    sx, cx, sy, cy = np.sin(k * x), np.cos(k * x), np.sin(k * y), np.cos(k * y)
    s2x, c2x, s2y, c2y = np.sin(2 * k * x), np.cos(2 * k * x), np.sin(2 * k * y), np.cos(2 * k * y)
    a2b, ab2 = amp_a**2 * amp_b, amp_a * amp_b**2
    want_b = np.stack(
        [
            -a2b / (10 * k) * s2x * cy - ab2 / (4 * k) * (sx + sx * c2y / 5),
            -ab2 / (10 * k) * cx * s2y - a2b / (4 * k) * (sy + c2x * sy / 5),
            0 * x,
        ],
        -1,
    )
    curl = amp_a * amp_b / (20 * k)
    want_c = np.stack(
        [
            -curl * (amp_a * s2x * cy - 2 * amp_b * sx * c2y),
            curl * (2 * amp_a * c2x * sy - amp_b * cx * s2y),
            0 * x,
        ],
        -1,
    )
    np.testing.assert_allclose(s3a, 0, atol=1e-12)
    np.testing.assert_allclose(s3b, want_b, atol=1e-10)
    np.testing.assert_allclose(s3c, want_c, atol=1e-10)


def test_3lpt_terms_are_third_order_and_enter_positions_and_momenta(x64):
    """3LPT = 2LPT + sum D3 s3 in position and sum D3' s3 in momentum."""
    cfg = distpm.SimConfig(
        box_size=128.0, mesh_shape=8, lpt_order=3, dtype="float64", a_start=0.2, parallel="1x1"
    )
    layout = Layout(cfg.particle_shape)
    modes = ic.linear_modes(distpm.white_noise(0, cfg), COSMO, layout, cfg)
    pos3, vel3, _ = ic.lpt(modes, COSMO, layout, cfg)
    pos2, vel2, _ = ic.lpt(modes, COSMO, layout, cfg.replace(lpt_order=2))
    _, _, s3 = ic.lpt_displacements(modes, layout, cfg)
    factors = growth3(0.2, growth_table(COSMO, order=3))
    disp = sum(d * s for (d, _), s in zip(factors, s3, strict=True))
    mom = sum(dp * s for (_, dp), s in zip(factors, s3, strict=True))
    shift = (pos3 - pos2 + 64.0) % 128.0 - 64.0
    np.testing.assert_allclose(shift, disp, atol=1e-10)
    e = distpm.background.E(0.2, COSMO)
    np.testing.assert_allclose(vel3 - vel2, 0.2**2 * e * mom, atol=1e-10)
    assert np.max(np.abs(disp)) > 1e-4


@pytest.mark.parametrize("grid", [(2, 2), (4, 2)])
def test_3lpt_initial_conditions_equal_one_device(grid):
    base = distpm.SimConfig(mesh_shape=16, box_size=64.0, lpt_order=3, parallel=(1, 1))
    states = [
        distpm.initial_conditions(distpm.white_noise(2, cfg), COSMO, cfg)
        for cfg in (base, base.on(grid))
    ]
    for field, tolerance in (("pos", 2e-5), ("vel", 1e-5)):
        one, many = (s.by_id(field) for s in states)
        np.testing.assert_allclose(many, one, atol=tolerance, err_msg=field)


def test_3lpt_gradient_matches_finite_differences(x64):
    cfg = distpm.SimConfig(
        box_size=128.0, mesh_shape=16, n_steps=3, lpt_order=3, dtype="float64", parallel="1x1"
    )
    noise = distpm.white_noise(0, cfg)

    @jax.jit
    def loss(noise, omega_c):
        state = distpm.simulate(noise, COSMO.replace(Omega_c=omega_c), cfg)
        return jnp.sum(distpm.density(state, cfg) ** 2)

    omega_c = jnp.float64(COSMO.Omega_c)
    g_noise, g_omega = jax.grad(loss, argnums=(0, 1))(noise, omega_c)
    v = jnp.asarray(np.random.default_rng(1).normal(size=noise.shape))
    eps = 1e-6
    fd = (loss(noise + eps * v, omega_c) - loss(noise - eps * v, omega_c)) / (2 * eps)
    np.testing.assert_allclose(float(jnp.vdot(g_noise, v)), float(fd), rtol=1e-4)
    fd = (loss(noise, omega_c + eps) - loss(noise, omega_c - eps)) / (2 * eps)
    np.testing.assert_allclose(float(g_omega), float(fd), rtol=1e-4)
