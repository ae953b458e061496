"""Lightcone: distances, sky pixels, crossings and Born maps against independent references."""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import optional_import
from scipy import integrate

healpy = optional_import("healpy")  # before distpm.lightcone, which needs it

from lcdm import chi_of_a as _chi  # noqa: E402
from lcdm import growth_of_a as _growth  # noqa: E402

import distpm  # noqa: E402
from distpm import background  # noqa: E402
from distpm.lightcone import LightconeConfig, SourceDistribution, lightcone, record, sky  # noqa: E402

COSMO = distpm.Cosmology.planck18()
C = background.C_OVER_H0


def _shells(cfg, lc, cosmo=COSMO):
    return record.tables(cosmo, cfg, lc)


CFG32 = distpm.SimConfig(box_size=300.0, mesh_shape=8, a_start=0.5, n_steps=4, parallel="1x1")


def _numpy_crossings(pos, dx, shell, obs, box, reach):
    """Every periodic image's crossing of one drift, by bisection in float64 (numpy, scipy)."""
    a0, a1, d0, d1, c0, c1 = (float(v) for v in shell)
    a_grid = np.linspace(a0, a1, 201)
    d_grid = np.array([_growth(x) for x in a_grid])
    chi_grid = np.array([_chi(x) for x in a_grid])
    out = []
    rng = range(-reach, reach + 1)
    for shift in np.array(np.meshgrid(rng, rng, rng, indexing="ij")).reshape(3, -1).T * box:
        x0 = pos + shift - obs
        hit = (np.linalg.norm(x0, axis=1) < c0) & (np.linalg.norm(x0 + dx, axis=1) >= c1)
        if not hit.any():
            continue
        lo, hi = np.full(hit.sum(), a0), np.full(hit.sum(), a1)
        for _ in range(50):
            mid = 0.5 * (lo + hi)
            t = (np.interp(mid, a_grid, d_grid) - d0) / (d1 - d0)
            f = np.linalg.norm(x0[hit] + t[:, None] * dx[hit], axis=1) - np.interp(
                mid, a_grid, chi_grid
            )
            lo, hi = np.where(f < 0, mid, lo), np.where(f < 0, hi, mid)
        t = (np.interp(lo, a_grid, d_grid) - d0) / (d1 - d0)
        out.append((lo, x0[hit] + t[:, None] * dx[hit]))
    a = np.concatenate([o[0] for o in out])
    return a, np.concatenate([o[1] for o in out])


def test_one_drift_paints_every_crossing_with_born_weights(x64):
    """Counts equal the crossings found by brute force over all replicas (1e-6); the Born
    map equals a numpy implementation of the weights (1e-5 of its RMS), two sources."""
    cfg = CFG32.replace(dtype="float64")
    z_s = (0.3, 0.45)
    lc = LightconeConfig(source_redshifts=z_s, nside=16)
    shells, tab = _shells(cfg, lc)
    rng = np.random.default_rng(3)
    n, i = 3000, 2
    pos = rng.uniform(0, 300, (n, 3))
    dx = rng.normal(0, 4, (n, 3))
    rec = record.Recorder(lc, cfg)
    maps = rec.step_maps(jnp.asarray(pos), jnp.asarray(dx), jnp.ones(n, bool), shells[i], tab,
                         COSMO)["healpix"]  # fmt: skip
    obs = np.full(3, 150.0)
    a, r = _numpy_crossings(pos, dx, np.asarray(shells[i]), obs, 300.0, reach=6)
    chi = np.linalg.norm(r, axis=1)
    keep = chi <= _chi(1 / (1 + max(z_s)))
    a, r, chi = a[keep], r[keep], chi[keep]
    assert len(a) > 1000
    np.testing.assert_allclose(float(jnp.sum(maps[0])), len(a), rtol=1e-6)
    nside, npix = 16, 12 * 16**2
    pix, w = healpy.get_interp_weights(nside, *healpy.vec2ang(r))
    omega = sky.response("healpix", nside=nside)  # tests/test_sky.py checks it
    volume = 300.0**3 / 8**3
    for s, z in enumerate(z_s):
        g = np.maximum(0, 1 - chi / _chi(1 / (1 + z)))
        weight = 1.5 * COSMO.Omega_m / C**2 * volume * g / (a * chi)
        ref = np.zeros(npix)
        np.add.at(ref, pix.ravel(), (w * weight).ravel())
        ref = ref / omega
        ref -= ref.mean()
        got = np.asarray(maps[1 + s])
        assert np.max(np.abs(got - ref)) < 1e-5 * ref.std()


class _SmallBatches(record.Recorder):
    """A recorder whose list of crossings holds 50 entries: flushed many times a step."""

    def batch_size(self, n):
        return 50


def test_crossings_do_not_depend_on_slot_order_or_batch_size(x64):
    """A displaced lattice in lattice order (chunks of slots are compact: culling works),
    the same particles shuffled (chunks span the box) and a list of crossings of 50
    entries (flushed mid-pass, mid-replica and at the end) give the same maps; the counts
    equal a brute-force count over every replica, masked slots excluded."""
    cfg = CFG32.replace(dtype="float64")
    lc = LightconeConfig(source_redshifts=(0.45,), nside=16)
    shells, tab = _shells(cfg, lc)
    rng = np.random.default_rng(4)
    q = (np.arange(16) + 0.5) * 300.0 / 16
    pos = np.stack(np.meshgrid(q, q, q, indexing="ij"), -1).reshape(-1, 3)
    pos = (pos + rng.normal(0, 6, pos.shape)) % 300.0
    dx = rng.normal(0, 4, pos.shape)
    mask = rng.uniform(size=len(pos)) > 0.05
    i = 2
    obs = np.full(3, 150.0)
    _, r = _numpy_crossings(pos[mask], dx[mask], np.asarray(shells[i]), obs, 300.0, reach=6)
    seen = np.sum(np.linalg.norm(r, axis=1) <= _chi(1 / 1.45))
    shuffle = rng.permutation(len(pos))
    runs = {}
    for name, rec, order in [
        ("lattice", record.Recorder(lc, cfg), np.arange(len(pos))),
        ("shuffled", record.Recorder(lc, cfg), shuffle),
        ("small batches", _SmallBatches(lc, cfg), np.arange(len(pos))),
        ("both", _SmallBatches(lc, cfg), shuffle),
    ]:
        got = rec.step_maps(jnp.asarray(pos[order]), jnp.asarray(dx[order]),
                            jnp.asarray(mask[order]), shells[i], tab, COSMO)  # fmt: skip
        runs[name] = np.asarray(got["healpix"])
    ref = runs["lattice"]
    assert ref[0].sum() == pytest.approx(seen, rel=1e-9)
    assert seen > 500
    for name, m in runs.items():
        np.testing.assert_allclose(m, ref, rtol=0, atol=1e-9 * np.abs(ref).max(), err_msg=name)


def test_a_flat_field_alone_skips_what_lies_outside_its_cone(x64):
    """Without a HEALPix map the recorder solves only the crossings inside the flat field's
    cone (widened by the drift) and the replicas that meet it: the flat map equals the one
    recorded next to a full-sky map, which skips nothing."""
    cfg = CFG32.replace(dtype="float64")
    flat = dict(source_redshifts=(0.45,), flat_fov=50.0, flat_pixels=16)
    shells, tab = _shells(cfg, LightconeConfig(**flat))
    rng = np.random.default_rng(6)
    pos = rng.uniform(0, 300, (6000, 3))
    dx = rng.normal(0, 8, pos.shape)
    alone, both = (record.Recorder(LightconeConfig(**flat, **extra), cfg)
                   for extra in ({}, {"nside": 4}))  # fmt: skip
    assert len(alone.tiles) < len(both.tiles)
    maps = [
        rec.step_maps(jnp.asarray(pos), jnp.asarray(dx), jnp.ones(len(pos), bool), shells[2],
                      tab, COSMO)["flat"]
        for rec in (alone, both)
    ]  # fmt: skip
    ref = np.asarray(maps[1])
    assert ref[0].sum() > 300  # crossings inside the field
    np.testing.assert_allclose(np.asarray(maps[0]), ref, rtol=0, atol=1e-9 * np.abs(ref).max())
    # and so do the gradients of the flat map (the backward pass sweeps the same crossings)
    weights = jnp.asarray(rng.normal(size=ref.shape))

    def loss(rec, p, d):
        m = rec.step_maps(p, d, jnp.ones(len(pos), bool), shells[2], tab, COSMO)["flat"]
        return jnp.sum(weights * m)

    grads = [jax.grad(functools.partial(loss, rec), argnums=(0, 1))(jnp.asarray(pos),
                                                                    jnp.asarray(dx))
             for rec in (alone, both)]  # fmt: skip
    for g, r in zip(grads[0], grads[1], strict=True):
        g, r = np.asarray(g), np.asarray(r)
        assert np.abs(r).max() > 0
        np.testing.assert_allclose(g, r, rtol=0, atol=1e-9 * np.abs(r).max())
    v = jnp.asarray(rng.normal(size=pos.shape))
    eps = 1e-6  # the map is piecewise smooth (bilinear weights): a small step
    fd = (loss(alone, pos + eps * v, dx) - loss(alone, pos - eps * v, dx)) / (2 * eps)
    np.testing.assert_allclose(float(jnp.vdot(grads[0][0], v)), float(fd), rtol=1e-4)


def test_source_distribution_efficiency(x64):
    """g(chi) of a tabulated n(z) equals a scipy double integral of the Smail form."""
    cfg = CFG32.replace(dtype="float64")
    nz = SourceDistribution.smail(0.3, 2.0, 1.5, z_max=0.8, num=400)
    lc = LightconeConfig(source_redshifts=(), distributions=(nz,), nside=8)
    _, tab = _shells(cfg, lc)
    chi = np.array([200.0, 700.0, 1200.0])
    got = np.asarray(record.efficiency(jnp.asarray(chi), tab))[0]

    def n_of(z):
        return z**2 * np.exp(-((z / 0.3) ** 1.5))

    norm = integrate.quad(n_of, 0, 0.8)[0]
    zs = np.linspace(1e-4, 0.8, 801)
    chis = np.array([_chi(1 / (1 + z)) for z in zs])
    for c, g in zip(chi, got, strict=True):
        ref = integrate.quad(lambda z, c=c: n_of(z) * max(0, 1 - c / np.interp(z, zs, chis)),
                             0, 0.8, limit=200)[0] / norm  # fmt: skip
        np.testing.assert_allclose(g, ref, rtol=2e-3)


def test_bad_lightcone_configs_are_clear_errors():
    with pytest.raises(ValueError, match="choose a map"):
        LightconeConfig()
    with pytest.raises(ValueError, match="power of 2"):
        LightconeConfig(nside=12)
    with pytest.raises(ValueError, match="start the run earlier"):
        LightconeConfig(source_redshifts=(2.0,), nside=8).check(CFG32)
    with pytest.raises(ValueError, match="a_stop = 1"):
        LightconeConfig(source_redshifts=(0.2,), nside=8).check(CFG32.replace(a_stop=0.9))
    with pytest.raises(ValueError, match="outside the box"):
        LightconeConfig(observer=(0, 0, 400), nside=8).check(CFG32)
    with pytest.raises(ValueError, match="positive and increasing"):
        SourceDistribution(z=(0.5, 0.2), n=(1, 1))


RUN = distpm.SimConfig(
    box_size=400.0,
    mesh_shape=16,
    a_start=0.4,
    n_steps=6,
    parallel={"exchange_factor": 0.3, "devices": "1x1"},
)
RUN_LC = LightconeConfig(source_redshifts=(0.3, 0.6), nside=8, flat_fov=20.0, flat_pixels=16)


@pytest.fixture(scope="module")
def one_device_maps():
    with jax.enable_x64(True):
        cfg = RUN.replace(dtype="float64")
        maps, _ = lightcone(distpm.white_noise(4, cfg), COSMO, cfg, RUN_LC)
        return jax.tree.map(np.asarray, maps)


@pytest.mark.parametrize("grid", ["2x2", "4x2"])
def test_maps_do_not_depend_on_the_device_grid(one_device_maps, grid, x64):
    """Float64, so that the runs' own round-off (float32 positions differ by ~1e-6
    between grids) does not hide what the lightcone adds."""
    ref = one_device_maps
    cfg = RUN.replace(dtype="float64").on(grid)
    maps, _ = lightcone(distpm.white_noise(4, cfg), COSMO, cfg, RUN_LC)
    for kind, m in ref.items():
        scale = np.std(m) if "counts" not in kind else np.abs(m).max()
        np.testing.assert_allclose(np.asarray(maps[kind]), m, atol=1e-5 * scale, rtol=0)
        if "counts" not in kind:  # each step's mean over the area is subtracted
            omega = sky.flat_solid_angles(20.0, 16) if kind == "flat" else np.ones(m.shape[1:])
            mean = np.sum(m * omega, axis=tuple(range(1, m.ndim))) / omega.sum()
            assert np.all(np.abs(mean) < 1e-9 * np.std(m))
    assert ref["healpix"].shape == (2, 12 * 8**2) and ref["flat"].shape == (2, 16, 16)
    # the counts hold every particle image inside z = 0.6 (about n V)
    chi = _chi(1 / 1.6)
    expected = 16**3 / 400.0**3 * 4 / 3 * np.pi * chi**3
    assert abs(ref["healpix_counts"].sum() / expected - 1) < 0.02


def _static_maps(pos, cfg, lc):
    """Maps of particles that do not move, recorded over all of cfg's steps (one device)."""
    shells, tab = _shells(cfg, lc)
    rec = record.Recorder(lc, cfg)
    n = pos.shape[0]

    @jax.jit
    def one(p, shell):
        return rec.step_maps(p, jnp.zeros_like(p), jnp.ones(n, bool), shell, tab, COSMO)

    steps = [one(jnp.asarray(pos, jnp.float32), shells[i]) for i in range(shells.shape[0])]
    return jax.tree.map(lambda *m: np.asarray(sum(m), np.float64), *steps)


SHOT = distpm.SimConfig(box_size=2000.0, mesh_shape=64, a_start=0.75, n_steps=8, parallel="1x1")


def test_random_particles_give_the_shot_noise_level():
    """Poisson points (64^3 in a 2 Gpc/h box, z_s = 0.25, inside one replica): C_ell of the
    convergence is flat at n int dchi chi^2 w(chi)^2, w the Born weight of one particle."""
    zs, nside = 0.25, 256
    lc = LightconeConfig(source_redshifts=(zs,), nside=nside)
    n = 64**3
    volume = 2000.0**3 / n
    chi_s = _chi(1 / (1 + zs))
    a_grid = np.linspace(0.78, 1.0, 300)
    chi_grid = np.array([_chi(a) for a in a_grid])[::-1]

    def weight(chi):
        a = np.interp(chi, chi_grid, a_grid[::-1])
        return 1.5 * COSMO.Omega_m / C**2 * volume * (1 - chi / chi_s) / (a * chi)

    level = integrate.quad(lambda c: c * c * weight(c) ** 2 / volume, 0, chi_s, limit=200)[0]
    ratios = []
    for seed in range(3):
        pos = np.random.default_rng(seed).uniform(0, 2000.0, (n, 3))
        m = _static_maps(pos, SHOT, lc)["healpix"]
        cl = healpy.anafast(m[1], lmax=60)
        chi = np.linalg.norm(pos - 1000.0, axis=1)
        chi = chi[chi < chi_s]
        assert m[0].sum() == pytest.approx(len(chi), rel=1e-6)  # every particle inside, once
        this = np.sum(weight(chi) ** 2) / (4 * np.pi)  # this realisation's shot noise
        assert np.mean(cl[10:61]) / this == pytest.approx(1, abs=0.05)
        assert np.mean(cl[10:35]) / np.mean(cl[35:61]) == pytest.approx(1, abs=0.1)  # flat
        ratios.append(np.mean(cl[10:61]) / level)
    assert np.mean(ratios) == pytest.approx(1, abs=0.05), ratios


def test_an_unperturbed_lattice_gives_flat_counts():
    """Lattice points seen in one shell: the painted density per steradian varies far less
    than Poisson's would (the raw counts are not flat: they hold each pixel's response)."""
    lc = LightconeConfig(source_redshifts=(0.25,), nside=4)
    q = (np.arange(64) + 0.5) * 2000.0 / 64
    lattice = np.stack(np.meshgrid(q, q, q, indexing="ij"), -1).reshape(-1, 3)
    shells, tab = _shells(SHOT, lc)
    rec = record.Recorder(lc, SHOT)
    i = 1  # chi from ~640 to ~520 Mpc/h: pixels ~ 8 spacings, lattice spacing 31 Mpc/h
    counts = np.asarray(rec.step_maps(jnp.asarray(lattice, jnp.float32), jnp.zeros_like(lattice),
                                      jnp.ones(len(lattice), bool), shells[i], tab,
                                      COSMO)["healpix"][0])  # fmt: skip
    mean = counts.mean()
    assert mean > 40
    density = counts / sky.response("healpix", nside=4)  # per steradian
    scatter = density.std() / density.mean()
    assert scatter < 0.25 / np.sqrt(mean), scatter  # Poisson: 1 / sqrt(mean)


def _limber_linear(ell, z_s, power=None):
    """Limber C_ell of the linear P(k, a) by scipy quadrature (independent of the package's);
    ``power(k, a)`` [(Mpc/h)^3], default distpm's Eisenstein-Hu."""
    if power is None:
        power = lambda k, a: float(distpm.linear_power(np.array([k]), COSMO, a)[0])  # noqa: E731
    chi_s = _chi(1 / (1 + z_s))
    a_grid = np.linspace(1 / (1 + z_s), 1.0, 200)
    chi_grid = np.array([_chi(a) for a in a_grid])[::-1]
    pre = 2.25 * COSMO.Omega_m**2 / C**4

    def integrand(chi, ell):
        a = np.interp(chi, chi_grid, a_grid[::-1])
        p = power((ell + 0.5) / chi, a)
        return (1 - chi / chi_s) ** 2 / a**2 * p

    # epsrel 1e-6, 2000 times below the tests' tolerances: quad's default (1.5e-8) is below
    # the round-off of a(chi)'s kinks and took every subinterval (3.7 times the calls of P)
    quad = functools.partial(integrate.quad, limit=200, epsrel=1e-6)
    return [pre * quad(integrand, 1.0, chi_s, args=(e,))[0] for e in ell]


def _distpm_run(out, sets, devices):
    """``distpm run --set ...`` in a process of its own (CPU, ``devices``), writing to ``out``."""
    import subprocess
    import sys

    args = ["run", "--out", str(out), "--no-progress", "--devices", devices]
    args += [x for s in sets for x in ("--set", s)]
    result = subprocess.run(
        [sys.executable, "-m", "distpm.cli.main", *args], cwd=out.parent, capture_output=True,
        text=True, timeout=600, env=dict(os.environ, JAX_PLATFORMS="cpu"),
    )  # fmt: skip
    assert result.returncode == 0, result.stdout + result.stderr


def test_distpm_run_writes_the_lightcone(one_device_maps, tmp_path, x64):
    """The CLI's step-by-step recording gives the maps of :func:`lightcone` (same run, 2x2);
    its C_ell table holds the maps' spectra and the Limber predictions."""
    import json

    out = tmp_path / "out"
    sets = [
        "box_size=400.0", "mesh_shape=16", "a_start=0.4", "n_steps=6",
        "parallel.exchange_factor=0.3", 'dtype="float64"', "seed=4",
        'output.snapshot_format="none"',
        "lightcone.source_redshifts=[0.3, 0.6]", "lightcone.nside=8",
        "lightcone.flat_fov=20.0", "lightcone.flat_pixels=16",
    ]  # fmt: skip
    _distpm_run(out, sets, "2x2")
    folder = out / "lightcone"
    fits = healpy.read_map(folder / "kappa_healpix.fits", field=None)
    ref = one_device_maps
    for got, want in ((fits[:2], ref["healpix"]), (fits[2], ref["healpix_counts"])):
        np.testing.assert_allclose(got, want, atol=1e-5 * np.std(want), rtol=0)
    flat = np.load(folder / "kappa_flat.npy")
    np.testing.assert_allclose(flat, ref["flat"], atol=1e-5 * np.std(ref["flat"]), rtol=0)
    table = np.loadtxt(folder / "cl_healpix.txt")
    ell = table[:, 0]
    assert ell[0] == 2 and ell[-1] == 3 * 8 - 1
    for s in range(2):
        cl = healpy.anafast(fits[s], lmax=23)[2:]
        np.testing.assert_allclose(table[:, 1 + 3 * s], cl, rtol=1e-6)  # 7 digits in the file
        assert np.all(table[:, 3 + 3 * s] > 0)  # Limber of the measured P(k, a)
    picks = [0, 10, 21]
    lin = _limber_linear(ell[picks], 0.6)
    np.testing.assert_allclose(table[picks, 5], lin, rtol=2e-3)
    # shear maps (gamma1, gamma2, g1, g2 per source) and the spectra of every pair of sources
    from distpm.lightcone import shear

    sheared = healpy.read_map(folder / "shear_healpix.fits", field=None)
    assert sheared.shape == (8, 12 * 8**2)
    for s in range(2):
        want = shear.healpix_shear(fits[s])
        np.testing.assert_allclose(sheared[4 * s : 4 * s + 2], want, atol=1e-6 * np.std(want))
        np.testing.assert_allclose(sheared[4 * s + 2], want[0] / (1 - fits[s]), rtol=1e-6)
    pairs = np.loadtxt(folder / "cl_pairs_healpix.txt")
    assert pairs.shape == (22, 1 + 3 * 5)
    cross = healpy.anafast(fits[0], fits[1], lmax=23)[2:]
    np.testing.assert_allclose(pairs[:, 6], cross, rtol=1e-5, atol=1e-6 * np.abs(cross).max())
    assert np.all(pairs[:, 9] > 0) and np.all(pairs[:, 10] > 0)  # Limber of the cross-spectrum
    assert np.load(folder / "shear_flat.npy").shape == (2, 4, 16, 16)
    for name in ("cl.png", "kappa_healpix.png", "kappa_flat.png", "cl_flat.txt",
                 "shear_healpix.png", "shear_flat.png", "cl_pairs_flat.txt",
                 "cl_pairs_healpix.png", "cl_pairs_flat.png"):  # fmt: skip
        assert (folder / name).stat().st_size > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["lightcone"]["nside"] == 8
    assert set(summary["outputs"]) >= {"lightcone/cl.png", "lightcone/kappa_healpix.fits"}


def test_the_2lpt_integrator_records_the_lightcone_of_its_own_drifts(one_device_maps, tmp_path):
    """With the 2LPT integrator the observers see each step in two pieces (its drifts run
    from midpoint to midpoint in D, across the step boundaries) and the closing drift at a
    stop: every particle image crosses once (the crossings of the FastPM run of the same
    noise, to a few in 1e6), the maps follow FastPM's, and ``distpm run`` on 2x2 (closing
    drifts seen by a program of their own, P(k) after every step for the Limber curves)
    gives the maps of :func:`lightcone` on one device."""
    with jax.enable_x64(True):
        cfg = RUN.replace(dtype="float64", integrator="2lpt", snapshots=(0.7,))
        ref = jax.tree.map(np.asarray, lightcone(distpm.white_noise(4, cfg), COSMO, cfg, RUN_LC)[0])
    fastpm = one_device_maps
    # a piece seen twice or missed would change the crossings by about 1/12; the images at
    # the far end, moved a little differently by the two integrators, by a few in 1e6
    assert abs(ref["healpix_counts"].sum() / fastpm["healpix_counts"].sum() - 1) < 1e-4
    for kind in ("healpix", "flat"):  # 6 steps of either integrator: maps 0.2-0.5% apart (rms)
        for s in range(2):
            gap = np.std(ref[kind][s] - fastpm[kind][s]) / np.std(fastpm[kind][s])
            assert 1e-6 < gap < 1e-2, (kind, s, gap)
    out = tmp_path / "out"
    sets = [
        "box_size=400.0", "mesh_shape=16", "a_start=0.4", "n_steps=6", 'integrator="2lpt"',
        "parallel.exchange_factor=0.3", 'dtype="float64"', "seed=4",
        'output.snapshot_format="none"', "snapshots=[0.7]",
        "lightcone.source_redshifts=[0.3, 0.6]", "lightcone.nside=8",
        "lightcone.flat_fov=20.0", "lightcone.flat_pixels=16",
    ]  # fmt: skip
    _distpm_run(out, sets, "2x2")
    fits = healpy.read_map(out / "lightcone" / "kappa_healpix.fits", field=None)
    for got, want in ((fits[:2], ref["healpix"]), (fits[2], ref["healpix_counts"])):
        np.testing.assert_allclose(got, want, atol=1e-5 * np.std(want), rtol=0)
    table = np.loadtxt(out / "lightcone" / "cl_healpix.txt")
    assert np.all(table[:, 3] > 0) and np.all(table[:, 6] > 0)  # Limber of the measured P(k, a)
