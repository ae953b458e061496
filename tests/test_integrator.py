"""Integrators: FastPM exact for Zel'dovich motion, "2lpt" exact for second-order motion,
converging PM plane wave, snapshots."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import distpm
import distpm.nbody.loop
import distpm.simulation
from distpm import background
from distpm.nbody import Schedule
from distpm.parallel import Layout
from distpm.parallel.decomposition import Decomposition
from distpm.state import Particles, lagrangian_block

COSMO = distpm.Cosmology.planck18()
BOX = 256.0


def plane_wave(cfg, amplitude):
    """Zel'dovich solution of a plane wave along x: (state at a, x at a, p at a) helpers.

    amplitude: D1(a=1) * A * k, the value of -ds/dq at a=1 (shell crossing at 1).
    """
    q, ids = lagrangian_block(cfg, Layout(cfg.particle_shape), jnp.float64)
    k = 2 * np.pi / BOX
    s = jnp.zeros_like(q).at[:, 0].set(amplitude / k * jnp.sin(k * q[:, 0]))
    table = background.growth_table(COSMO)

    def solution(a):
        d1, f1, _, _ = background.growth(a, table)
        return q + d1 * s, a**2 * background.E(a, COSMO) * f1 * d1 * s

    x0, p0 = solution(cfg.a_start)
    mask = jnp.ones(len(q), bool)
    a = jnp.asarray(cfg.a_start)
    state = Particles(pos=x0 % BOX, vel=p0, ids=ids, mask=mask, a=a)
    return q, s, state, solution


def _periodic(dx):
    return (dx + BOX / 2) % BOX - BOX / 2


def test_integrator_is_exact_for_zeldovich_plane_wave(x64, monkeypatch):
    """With the exact 1-D force F = 1.5 Omega_m (x - q) of a plane wave, the
    FastPM factors must reproduce the Zel'dovich solution to round-off."""
    cfg = distpm.SimConfig(
        box_size=BOX, mesh_shape=(64, 2, 2), dtype="float64", seed=101, parallel="1x1"
    )
    q, s, state, solution = plane_wave(cfg, amplitude=0.9)

    def exact_force(pos, mask, cosmo, layout, cfg, kick=None):
        force = 1.5 * cosmo.Omega_m * _periodic(pos - q)
        return force if kick is None else kick[0] + kick[1] * force

    monkeypatch.setattr(distpm.nbody.loop, "force", exact_force)
    out = distpm.evolve(state, COSMO, cfg)[-1]
    x1, p1 = solution(1.0)
    assert float(jnp.max(jnp.abs(_periodic(out.pos - x1)))) < 1e-4 * float(jnp.max(jnp.abs(s)))
    assert float(jnp.max(jnp.abs(out.vel - p1))) < 1e-4 * float(jnp.max(jnp.abs(p1)))


def _second_order_toy(cfg, seed=0):
    """Particles x = q + A s1 + B s2 with fixed random s1, s2 per particle, and the force
    1.5 Omega_m (A s1 + (B - A^2) s2), A and B read back from x - q: the force of 2LPT
    to second order. Its exact motion is A = D1, B = D2 (the growth ODEs), so
    x = q + D1 s1 + D2 s2 for all a. Returns (state at a_start, exact x(a), the force)."""
    q, ids = lagrangian_block(cfg, Layout(cfg.particle_shape), jnp.float64)
    rng = np.random.default_rng(seed)
    s1, s2 = (jnp.asarray(rng.normal(size=q.shape)) for _ in range(2))
    basis = jnp.stack([s1, s2], axis=-1)  # (n, 3, 2)
    table = background.growth_table(COSMO)

    def exact(a):
        d1, f1, d2, f2 = background.growth(a, table)
        scale = a**2 * background.E(a, COSMO)
        return q + d1 * s1 + d2 * s2, scale * (f1 * d1 * s1 + f2 * d2 * s2)

    def coefficients(v):  # (n, 2): v = c1 s1 + c2 s2 per particle
        gram = jnp.einsum("nik,nil->nkl", basis, basis)
        return jnp.linalg.solve(gram, jnp.einsum("nik,ni->nk", basis, v)[..., None])[..., 0]

    def toy_force(pos, mask, cosmo, layout, cfg, kick=None):
        coef = coefficients(_periodic(pos - q))
        big_a, big_b = coef[:, :1], coef[:, 1:]
        force = 1.5 * cosmo.Omega_m * (big_a * s1 + (big_b - big_a**2) * s2)
        return force if kick is None else kick[0] + kick[1] * force

    x0, p0 = exact(cfg.a_start)
    mask = jnp.ones(len(q), bool)
    state = Particles(pos=x0 % BOX, vel=p0, ids=ids, mask=mask, a=jnp.asarray(cfg.a_start))
    return state, exact, toy_force, coefficients


def test_2lpt_integrator_is_exact_for_second_order_motion(x64, monkeypatch):
    """In a toy whose exact motion is 2LPT, the "2lpt" integrator lands every particle on
    it at each output to round-off, in 5 steps with an output between; FastPM misses the
    second-order part by percents. Its synchronised momenta carry linear growth exactly."""
    cfg = distpm.SimConfig(
        box_size=BOX,
        mesh_shape=4,
        n_steps=5,
        snapshots=(0.37,),
        dtype="float64",
        integrator="2lpt",
        parallel="1x1",
    )
    state, exact, toy_force, coefficients = _second_order_toy(cfg)
    monkeypatch.setattr(distpm.nbody.loop, "force", toy_force)
    errors = {}
    for integrator in ("2lpt", "fastpm"):
        outs = distpm.evolve(state, COSMO, cfg.replace(integrator=integrator))
        errors[integrator] = []
        for out in outs:
            x, p = exact(float(out.a))
            # positions: the error in the coefficients of s1 and s2, relative to D2
            _, _, d2, _ = background.growth(float(out.a), background.growth_table(COSMO))
            wrong = coefficients(_periodic(out.pos - x))
            errors[integrator].append(float(jnp.max(jnp.abs(wrong)) / abs(d2)))
            if integrator == "2lpt":  # momenta: linear growth (the s1 coefficient) exact
                momentum_s1 = coefficients(p)[:, 0]
                np.testing.assert_allclose(coefficients(out.vel)[:, 0], momentum_s1, rtol=1e-9)
    assert max(errors["2lpt"]) < 1e-9, errors
    assert min(errors["fastpm"]) > 1e-2, errors


def test_pm_plane_wave_converges_to_zeldovich(x64):
    """The full PM run of a plane wave (to half the shell-crossing amplitude)
    matches Zel'dovich to better than 2% at 64 cells per wavelength and 0.7%
    at 256, limited by how CIC represents sub-cell displacements."""
    errors = {}
    for n in (64, 256):
        cfg = distpm.SimConfig(box_size=BOX, mesh_shape=(n, 2, 2), dtype="float64", parallel="1x1")
        _, s, state, solution = plane_wave(cfg, amplitude=0.5)
        out = distpm.evolve(state, COSMO, cfg)[-1]
        x1, _ = solution(1.0)
        errors[n] = float(jnp.max(jnp.abs(_periodic(out.pos - x1)))) / float(jnp.max(jnp.abs(s)))
    assert errors[64] < 2e-2 and errors[256] < 7e-3, errors
    assert errors[256] < 0.5 * errors[64], errors


def test_snapshots_are_states_on_the_way():
    """A snapshot at a grid point changes nothing; it equals a run that stops there.

    Splitting the step loop at the snapshot may change float32 round-off, so
    positions agree to 4 ulp of the box size.
    """
    base = distpm.SimConfig(
        box_size=128.0, mesh_shape=16, n_steps=9, a_start=0.1, a_stop=1.0, parallel="1x1"
    )
    noise = distpm.white_noise(2, base)
    with_snap = base.replace(snapshots=(0.5,))
    snap, final = distpm.simulate_snapshots(noise, COSMO, with_snap)
    plain = distpm.simulate(noise, COSMO, base)
    ulp4 = 4 * float(np.spacing(np.float32(128.0)))
    np.testing.assert_allclose(final.by_id(), plain.by_id(), rtol=0, atol=ulp4)
    early = distpm.simulate(noise, COSMO, base.replace(a_stop=0.5, n_steps=4))
    np.testing.assert_allclose(snap.by_id(), early.by_id(), rtol=0, atol=ulp4)
    assert float(snap.a) == pytest.approx(0.5) and float(final.a) == pytest.approx(1.0)


def _state(n, a):
    zeros = jnp.zeros((n, 3))
    return Particles(
        pos=zeros,
        vel=zeros,
        ids=jnp.zeros((n, 2), jnp.int32),
        mask=jnp.ones(n, bool),
        a=a,
    )


def test_evolve_rejects_a_state_of_the_wrong_size():
    cfg = distpm.SimConfig(box_size=128.0, mesh_shape=8, parallel="1x1")
    with pytest.raises(ValueError, match=r"state.pos has shape \(10, 3\), expected \(512, 3\)"):
        distpm.evolve(_state(10, jnp.asarray(0.1)), COSMO, cfg)


def test_evolve_rejects_a_state_at_another_time():
    cfg = distpm.SimConfig(box_size=128.0, mesh_shape=8)
    with pytest.raises(ValueError, match="evolve starts at a_start"):
        distpm.evolve(_state(512, jnp.asarray(0.5)), COSMO, cfg)


def test_step_in_place_reuses_the_state_buffers_and_gives_the_same_step():
    cfg = distpm.SimConfig(
        mesh_shape=16, box_size=64.0, parallel={"devices": "2x2", "exchange_factor": 0.25}
    )
    sched = Schedule.of(COSMO, cfg)
    start = distpm.simulation.kick(
        distpm.initial_conditions(distpm.white_noise(0, cfg), COSMO, cfg),
        sched.factors[0, 0], COSMO, cfg,
    )[0]  # fmt: skip
    args = sched.kicks()[0], np.float32(cfg.time_grid[1]), COSMO
    plain = distpm.simulation.step.lower(start, *args, cfg=cfg).compile()
    in_place = distpm.simulation.step_in_place.lower(start, *args, cfg=cfg).compile()
    state_bytes = sum(x.nbytes for x in (start.pos, start.vel)) // Decomposition.of(cfg).n_devices
    assert plain.memory_analysis().alias_size_in_bytes == 0
    assert in_place.memory_analysis().alias_size_in_bytes >= state_bytes
    expected = plain(start, *args)[0]
    copy = jax.tree.map(jnp.copy, start)
    result = in_place(copy, *args)[0]
    assert copy.pos.is_deleted() and not start.pos.is_deleted()
    for name in ("pos", "vel", "ids", "mask"):
        np.testing.assert_array_equal(getattr(result, name), getattr(expected, name))


@pytest.mark.parametrize("integrator", ["fastpm", "2lpt"])
def test_the_cli_steps_give_the_run_of_evolve(integrator):
    """``distpm run`` steps one program at a time with merged steps (not synchronised
    between steps, synchronised at each output); its outputs are evolve's to round-off."""
    from distpm import pipeline

    cfg = distpm.SimConfig(
        box_size=64.0,
        mesh_shape=16,
        n_steps=5,
        snapshots=(0.5,),
        integrator=integrator,
        parallel={"devices": "2x2", "exchange_factor": 0.3},
    )
    expected = distpm.simulate_snapshots(distpm.white_noise(cfg.seed, cfg), COSMO, cfg)
    stepped = {}
    for step, state, _, kicked in pipeline.evolve_with_progress(COSMO, cfg, progress=False):
        stepped[step] = kicked, state.by_id("pos"), state.by_id("vel")
    ends = list(Schedule.stops_of(cfg))
    assert [step for step, (kicked, *_) in stepped.items() if not kicked] == [0, *ends]
    for end, state in zip(ends, expected, strict=True):
        _, pos, vel = stepped[end]
        np.testing.assert_allclose(pos, state.by_id("pos"), rtol=0, atol=1e-5 * 64.0)
        np.testing.assert_allclose(vel, state.by_id("vel"), rtol=0, atol=1e-5 * np.abs(vel).max())
    # between outputs, FastPM's positions are the run's and its momenta half a step
    # ahead; the 2LPT integrator's momenta are the run's and its positions behind
    before = ends[0] - 1
    synced = distpm.simulate_snapshots(
        distpm.white_noise(cfg.seed, cfg), COSMO, cfg.replace(snapshots=(cfg.time_grid[before],))
    )[0]
    kicked, pos, vel = stepped[before]
    assert kicked
    if integrator == "fastpm":  # positions the run's, momenta half a step ahead
        same, other = "pos", "vel"
    else:  # momenta the run's, positions half a step behind
        same, other = "vel", "pos"
    values = {"pos": pos, "vel": vel}
    scale = np.abs(synced.by_id(same)).max()
    np.testing.assert_allclose(values[same], synced.by_id(same), rtol=0, atol=1e-5 * scale)
    gap = values[other] - synced.by_id(other)
    gap = (gap + 32.0) % 64.0 - 32.0 if other == "pos" else gap / np.abs(vel).max()
    assert np.abs(gap).max() > 0.01, other


def test_the_2lpt_integrator_refuses_1lpt():
    """It starts from 2LPT momenta."""
    cfg = distpm.SimConfig(box_size=64.0, mesh_shape=8, n_steps=2, integrator="2lpt")
    with pytest.raises(ValueError, match="lpt_order = 2 or 3"):
        cfg.replace(lpt_order=1)


def test_2lpt_drift_knots_halve_each_step_in_the_growth_factor():
    """The observers' pieces of the 2LPT integrator: a_i, then a_m with D(a_m) the mean of
    D at the step's ends (the integrator's midpoint), then a_(i+1)."""
    cfg = distpm.SimConfig(box_size=64.0, mesh_shape=8, n_steps=3, a_start=0.2)
    knots = np.asarray(distpm.nbody.schedule.drift_knots(COSMO, cfg.replace(integrator="2lpt")))
    grid = cfg.time_grid
    np.testing.assert_array_equal(knots[::2], np.float32(grid))
    d = lambda a: np.asarray(background.growth(a, background.growth_table(COSMO))[0])  # noqa: E731
    np.testing.assert_allclose(d(knots[1::2]), 0.5 * (d(grid[:-1]) + d(grid[1:])), rtol=1e-6)
    assert np.all(np.diff(knots) > 0)
    np.testing.assert_array_equal(distpm.nbody.schedule.drift_knots(COSMO, cfg), np.float32(grid))


def test_2lpt_power_every_step_is_that_of_the_synchronised_state(x64):
    """P(k) after the first of two steps inside a 2LPT run on 2x2 (the observer sees the
    positions at the step boundary, half a drift from the devices that own them) equals
    the P(k) of the same run's state synchronised there (a snapshot stops the run at that
    boundary). Cells of 2 Mpc/h and a long first step: particles leave their blocks."""
    from distpm.analysis.power_steps import PowerSteps

    cfg = distpm.SimConfig(
        box_size=32.0, mesh_shape=16, n_steps=2, a_start=0.1, integrator="2lpt",
        dtype="float64",
        parallel={"devices": "2x2", "exchange_factor": 0.5, "capacity_factor": 2.0},
    )  # fmt: skip
    state = distpm.initial_conditions(distpm.white_noise(3, cfg), COSMO, cfg)
    _, (rows,) = distpm.evolve(state, COSMO, cfg, observers=[PowerSteps(cfg, 1)])
    with_snapshot = cfg.replace(snapshots=(float(cfg.time_grid[1]),))
    middle, _ = distpm.evolve(state, COSMO, with_snapshot)
    _, p, n_modes = distpm.power_spectrum(distpm.density(middle, cfg), cfg)
    filled = np.asarray(n_modes) > 0
    np.testing.assert_allclose(np.asarray(rows)[0][filled], np.asarray(p)[filled], rtol=1e-9)
    assert not np.allclose(np.asarray(rows)[0], np.asarray(rows)[1], rtol=0.01)  # it grew
