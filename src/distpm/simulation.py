"""Public entry points: initial conditions -> N-body steps -> density.

Every function runs on the device grid of ``Decomposition.of(cfg)`` (``shard_map``
over :func:`distpm.parallel.devices.device_mesh`): fields are split as
pencils ``P("x", "y")`` and particles live in per-device buffers
(:class:`distpm.Particles`). All are jitted with ``cfg`` static and
differentiable with respect to the noise and the cosmology. Particle
buffer overflows raise :class:`distpm.CapacityError` once the program has
run. Inside a user's ``jax.jit`` or ``jax.grad`` the overflow cannot leave
the program: it makes the results (and gradients) NaN instead (no host
callback is put into a program, see
:func:`distpm.parallel.overflow.checked`); the same call outside ``jit``
says which buffer to enlarge.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from distpm import ic
from distpm.gravity import paint_density
from distpm.nbody import loop
from distpm.nbody.schedule import Schedule
from distpm.ops.buffers import zeros_after
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel import overflow
from distpm.parallel.decomposition import FIELD, SLOTS, Decomposition
from distpm.state import PARTICLES, Particles, wrap

_jit = functools.partial(jax.jit, static_argnames=("cfg",))


def _place(pos, vel, ids, n, cfg, after=None):
    """Send a device's particles, the first ``n`` of its slots, to their
    owners (the mask made after ``after``, if not None: see :func:`distpm.ic._wavenumbers`)."""
    zero = zeros_after((), jnp.int32, after)
    dec = Decomposition.of(cfg)
    mask = jnp.arange(dec.capacity) + zero < n
    layout = dec.mesh
    pos, vel, (ids,), mask, needs = loop.migrate(pos, vel, (ids,), mask, layout, cfg)
    return pos, vel, ids, mask, layout.device_max(needs)


@functools.partial(jax.jit, static_argnames=("cfg", "remade"))
def _initial_conditions(noise, cosmo, cfg, remade=False):
    def local(noise, cosmo):
        dec = Decomposition.of(cfg)
        layout = dec.lattice
        after = noise if remade else None  # see ic._wavenumbers
        delta_k = ic.linear_modes(noise, cosmo, layout, cfg, after=after)
        pos, vel, ids = ic.lpt(
            delta_k, cosmo, layout, cfg, after=after, slots=dec.capacity, in_turn=not remade
        )
        pos, vel, ids, mask, needs = _place(pos, vel, ids, noise.size, cfg, after)
        a = jnp.asarray(cfg.a_start, pos.dtype)
        state = Particles(pos=pos, vel=vel, ids=ids, mask=mask, a=a)
        return state, needs

    return Decomposition.of(cfg).sharded(local, (FIELD, P()), (PARTICLES, P()))(noise, cosmo)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def _recomputed_initial_conditions(noise, cosmo, cfg):
    """:func:`_initial_conditions` whose derivative makes them again in the backward pass
    instead of keeping their intermediates (a gradient through a run would hold them
    through the whole adjoint of the steps)."""
    return _initial_conditions(noise, cosmo, cfg)


def _recompute_fwd(noise, cosmo, cfg):
    return _initial_conditions(noise, cosmo, cfg), (noise, cosmo)


def _recompute_bwd(cfg, inputs, cotangents):
    # the remake waits for the adjoint of what came after it (zero times the cotangents),
    # where XLA's scheduler would otherwise run it early and hold its intermediates. The
    # cotangents are first written whole (0 added in place to one element): one element
    # read from the buffers of the migration that made them would keep those through the
    # remake. Its fields of k and the cosmology are not shared with the first making's
    # (remade: see ic._wavenumbers).
    g = cotangents[0]
    g = g.replace(pos=g.pos.at[0, 0].add(0.0), vel=g.vel.at[0, 0].add(0.0))
    zero = 0.0 * (g.pos[0, 0] + g.vel[0, 0])
    noise, cosmo = jax.tree.map(lambda x: x + zero.astype(x.dtype), inputs)
    _, vjp = jax.vjp(lambda n, c: _initial_conditions(n, c, cfg, remade=True), noise, cosmo)
    return vjp((g, *cotangents[1:]))


_recomputed_initial_conditions.defvjp(_recompute_fwd, _recompute_bwd)


def initial_conditions(noise, cosmo, cfg) -> Particles:
    """LPT particles at ``cfg.a_start`` from white noise.

    noise: ``cfg.particle_shape`` array of N(0, 1) values (see
    :func:`distpm.white_noise`); any finite real array of that shape is
    accepted, which is what inference optimises over. Concrete noise and
    cosmological parameters are checked (NaN, unphysical values); traced
    ones (inside ``jax.jit``, ``jax.grad``) cannot be.
    """
    cfg.check_runnable()
    ic.check_noise(noise, cfg)
    cosmo.check()
    state, needs = _recomputed_initial_conditions(noise, cosmo, cfg)
    return parallel_migrate.checked(state, needs, cfg)


def _kick(state, k, cosmo, cfg):
    def local(state, k, cosmo):
        layout = Decomposition.of(cfg).mesh
        ints = (state.ids,)
        pos, vel, (ids,), mask, needs = loop.kick(
            state.pos, state.vel, ints, state.mask, k, cosmo, layout, cfg
        )
        return state.replace(pos=pos, vel=vel, ids=ids, mask=mask), layout.device_max(needs)

    return Decomposition.of(cfg).sharded(local, (PARTICLES, P(), P()), (PARTICLES, P()))(
        state, k, cosmo
    )


kick = _jit(_kick)
kick.__doc__ = """(state with its momenta kicked by ``k`` with the force at its positions, needs).

The particles are first sent to the devices that own their positions. With
``k`` a step's K1 (``Schedule.of(cosmo, cfg).factors[i, 0]``), this
prepares synchronised particles (from :func:`initial_conditions`, a
checkpoint, a file) for :func:`step`; with minus the next step's K1 after a
step, it synchronises them again.
"""
# the same kick, reusing the input state's buffers (the state passed in is deleted)
kick_in_place = jax.jit(_kick, static_argnames=("cfg",), donate_argnames=("state",))


def _drift(state, d, cosmo, cfg, observers=(), records=None, stop=0):
    """(state with positions drifted by ``d`` times its momenta, needs), the particles sent
    to the devices that own their new positions: the 2LPT integrator's closing half
    drift (:meth:`Schedule.closing_drift`), which synchronises the state at a stop. With
    ``records`` (see :func:`step`), the observers see the drift (into the stop
    a[``stop``]) and (state, records, needs) is returned."""

    def local(state, d, cosmo, observers, records, stop):
        layout = Decomposition.of(cfg).mesh
        records = jax.tree.map(lambda r: r[0], records)
        records = loop.observe_closing_drift(
            observers, records, stop, state.pos, state.vel, d, state.mask, cosmo, layout
        )
        pos = wrap(state.pos + d.astype(state.pos.dtype) * state.vel, cfg.box_size)
        pos, vel, (ids,), mask, needs = loop.migrate(
            pos, state.vel, (state.ids,), state.mask, layout, cfg
        )
        state = state.replace(pos=pos, vel=vel, ids=ids, mask=mask)
        return state, jax.tree.map(lambda r: r[None], records), layout.device_max(needs)

    specs = (PARTICLES, P(), P(), P(), SLOTS, P())
    args = (state, d, cosmo, observers, records or (), jnp.asarray(stop, jnp.int32))
    state, out, needs = Decomposition.of(cfg).sharded(local, specs, (PARTICLES, SLOTS, P()))(*args)
    return (state, needs) if records is None else (state, out, needs)


drift = _jit(_drift)
# the same drift, reusing the input state's buffers and records (as ``step_in_place``)
drift_in_place = jax.jit(_drift, static_argnames=("cfg",), donate_argnames=("state", "records"))


def _step(state, kicks, a_next, cosmo, cfg, observers=(), records=None, step=0):
    """One merged step (D, K, S, B) (a row of :meth:`Schedule.kicks`); returns (state at
    a_next, needs), and the observers' records after them when ``records`` is given.

    ``state`` must be as the previous step left it, or synchronised and, for
    FastPM, kicked by the step's K1 with the force at ``state.pos`` (:func:`kick`).
    Between steps the state is not synchronised and not for analysis or files:
    FastPM's momenta are half a step ahead of the positions (with K = K2 alone the
    step ends synchronised), and the 2LPT integrator's positions half a step behind
    (:func:`drift` by :meth:`Schedule.closing_drift` synchronises them). records: the
    observers' records (:func:`empty_records`), one row per device; step:
    the step's index into ``cfg.time_grid``, for the observers.
    """

    def local(state, kicks, a_next, cosmo, observers, records, step):
        layout = Decomposition.of(cfg).mesh
        carry = (state.pos, state.vel, (state.ids,), state.mask, parallel_migrate.no_needs())
        records = jax.tree.map(lambda r: r[0], records)
        carry, records = loop.observed_step(
            carry, records, step, kicks, cosmo, observers, layout, cfg
        )
        pos, vel, (ids,), mask, needs = carry
        a = jnp.asarray(a_next, pos.dtype)
        state = Particles(pos=pos, vel=vel, ids=ids, mask=mask, a=a)
        return state, jax.tree.map(lambda r: r[None], records), layout.device_max(needs)

    specs = (PARTICLES, P(), P(), P(), P(), SLOTS, P())
    args = (state, kicks, a_next, cosmo, observers, records or (), jnp.asarray(step, jnp.int32))
    state, out, needs = Decomposition.of(cfg).sharded(local, specs, (PARTICLES, SLOTS, P()))(*args)
    return (state, needs) if records is None else (state, out, needs)


step = jax.jit(_step, static_argnames=("cfg",))
# The same step, reusing the input state's buffers (and records) for the output (about 20%
# of the step's memory): what is passed in is deleted. For loops that keep only the newest
# state, like the CLI's.
step_in_place = jax.jit(_step, static_argnames=("cfg",), donate_argnames=("state", "records"))


@functools.partial(jax.jit, static_argnames=("cfg",))
def empty_records(observers, cfg):
    """The observers' records before the first step, one row per device (see :func:`step`)."""

    def local(observers):
        return tuple(jax.tree.map(lambda r: r[None], o.empty(cfg.float_dtype)) for o in observers)

    return Decomposition.of(cfg).sharded(local, (P(),), SLOTS)(observers)


@functools.partial(jax.jit, static_argnames=("cfg",))
def finish(observers, records, state, cosmo, cfg):
    """The observers' results from their records and the final state (see
    :class:`distpm.nbody.observer.Observer`)."""

    def local(observers, records, state, cosmo):
        layout = Decomposition.of(cfg).mesh
        pairs = zip(observers, records, strict=True)
        return tuple(
            o.finish(jax.tree.map(lambda x: x[0], r), state.pos, state.mask, cosmo, layout)
            for o, r in pairs
        )

    specs = (P(), SLOTS, PARTICLES, P())
    return Decomposition.of(cfg).sharded(local, specs, P())(observers, records, state, cosmo)


@_jit
def _evolve(state, cosmo, observers, cfg):
    def local(state, cosmo, observers):
        layout = Decomposition.of(cfg).mesh
        out, needs = [], parallel_migrate.no_needs()
        records = tuple(o.empty(cfg.float_dtype) for o in observers)
        for part in Schedule.of(cosmo, cfg).segments():
            state, seg_needs, records = loop.run(
                state, part, cosmo, layout, cfg, observers, records
            )
            needs = overflow.most(needs, seg_needs)
            out.append(state)
        pairs = zip(observers, records, strict=True)
        results = tuple(o.finish(r, state.pos, state.mask, cosmo, layout) for o, r in pairs)
        return out, results, layout.device_max(needs)

    n_out = len(Schedule.stops_of(cfg))
    specs = ([PARTICLES] * n_out, P(), P())
    return Decomposition.of(cfg).sharded(local, (PARTICLES, P(), P()), specs)(
        state, cosmo, observers
    )


def evolve(state: Particles, cosmo, cfg, *, observers=()):
    """Evolve particles from ``cfg.a_start``; return them at each snapshot and at a_stop.

    state: particles at ``cfg.a_start`` as made by :func:`initial_conditions`
    (``pos`` [Mpc/h], ``vel`` canonical momenta at ``a``; ``mask`` and
    ``ids`` kept). Positions may have been changed: particles are sent to
    their owners first. Each snapshot costs one force more than its steps
    (the momenta are synchronised there, see :mod:`distpm.nbody.schedule`).

    observers: outputs made during the steps (:class:`distpm.nbody.observer.Observer`,
    e.g. :class:`distpm.lightcone.LightconeObserver`); with them, returns
    (states, their results in the same order). Concrete cosmological
    parameters are checked (:meth:`distpm.Cosmology.check`).
    """
    cfg.check_runnable()
    cosmo.check()
    if (
        not isinstance(state.a, jax.core.Tracer)
        and abs(float(state.a) - cfg.a_start) > 1e-6 * cfg.a_start
    ):
        raise ValueError(
            f"state.a = {float(state.a)} but cfg.a_start = {cfg.a_start}: evolve starts at a_start"
        )
    dec = Decomposition.of(cfg)
    slots = dec.slots
    for name, shape in (
        ("pos", (slots, 3)),
        ("vel", (slots, 3)),
        ("ids", (slots, 2)),
        ("mask", (slots,)),
    ):
        got = tuple(getattr(state, name).shape)
        if got != shape:
            raise ValueError(
                f"state.{name} has shape {got}, expected {shape} ({dec.n_devices} devices x "
                f"{dec.capacity} slots); make the state with distpm.initial_conditions for this cfg"
            )
    states, results, needs = _evolve(state, cosmo, tuple(observers), cfg)
    states, results = parallel_migrate.checked((states, results), needs, cfg)
    return (states, results) if observers else states


def simulate_snapshots(noise, cosmo, cfg) -> list[Particles]:
    """Particles at each of ``cfg.snapshots`` and at ``cfg.a_stop``, in time order."""
    return evolve(initial_conditions(noise, cosmo, cfg), cosmo, cfg)


def simulate(noise, cosmo, cfg) -> Particles:
    """Run the simulation from white noise; return the particles at ``cfg.a_stop``.

    ``pos`` [Mpc/h], ``vel`` [100 km/s] canonical momentum a^2 dx/dt
    (peculiar velocity = vel / a) at ``a``, the scale factor; ``pos[mask]``
    are the N particles, ``ids`` their Lagrangian indices (see
    :class:`distpm.Particles`).
    """
    return simulate_snapshots(noise, cosmo, cfg)[-1]


@functools.partial(jax.jit, static_argnames=("cfg", "migrate"))
def _density(particles, cfg, migrate=True):
    dec = Decomposition.of(cfg)

    def local(particles):
        layout = dec.mesh
        if isinstance(particles, Particles):  # near their owners: neighbours first
            pos, mask, near = particles.pos, particles.mask, dec.neighbour_size
        else:  # an even share of a plain (N, 3) array, padded to the buffer size
            n = particles.shape[0]
            pos = jnp.pad(particles, [(0, dec.capacity - n), (0, 0)])
            mask, near = jnp.arange(dec.capacity) < n, None
        if migrate:  # each device paints the particles in its block: send the others there
            (pos,), _, mask, needs = parallel_migrate.by_position(
                [wrap(pos, cfg.box_size)], [], mask, 0, layout, cfg.cell_size,
                dec.exchange_size, near,
            )  # fmt: skip
        else:
            needs = {"elsewhere": parallel_migrate.elsewhere(pos, mask, layout, cfg.cell_size)}
        return paint_density(pos, mask, layout, cfg) - 1.0, layout.device_max(needs)

    specs = PARTICLES if isinstance(particles, Particles) else SLOTS
    return dec.sharded(local, (specs,), (FIELD, P()))(particles)


def density(particles, cfg, *, migrate=True):
    """Density contrast delta on the PM mesh, split as pencils ``P("x", "y")``.

    particles: :class:`distpm.Particles`, or positions (N, 3) [Mpc/h] of all
    N particles in any order. Mass assignment with ``cfg.paint``; every
    particle carries the mean mass, so delta averages to zero.

    Particles outside their device's block (e.g. after ``state.replace(pos=...)``)
    and positions are first sent to the devices that own them, through the
    migration buffers (one migration, also for a run's particles, which
    already are where they belong). The particles of a run fit the buffers;
    an arbitrary array may move most particles between devices, which needs a
    larger ``exchange_factor`` and ``capacity_factor``: the
    :class:`~distpm.CapacityError` says by how much.

    migrate: False paints Particles where they are, without the migration and
    its buffers (a copy of the positions and the exchange's), for a run's
    particles, which its steps leave on their owners (``distpm run``'s
    outputs); a particle outside its device's block then raises a
    :class:`~distpm.CapacityError`, as an overflow does.
    """
    if not migrate and not isinstance(particles, Particles):
        raise ValueError("migrate=False is for Particles; positions always migrate")
    slots = Decomposition.of(cfg).slots
    if isinstance(particles, Particles):
        want = (slots, 3)
        what = "particles.pos"
        shape = tuple(particles.pos.shape)
    else:
        want = (cfg.n_particles, 3)
        what = "pos"
        shape = tuple(getattr(particles, "shape", ()))
    if shape != want:
        hint = ""
        if what == "pos" and shape == (slots, 3):
            hint = (
                "; this is the size of a run's particle buffers (valid and empty slots): "
                "pass the Particles themselves, distpm.density(particles, cfg)"
            )
        raise ValueError(
            f"{what} has shape {shape}, expected {want} for {cfg.particle_shape} particles "
            f"on {Decomposition.of(cfg).n_devices} devices{hint}"
        )
    delta, needs = _density(particles, cfg, migrate)
    return parallel_migrate.checked(delta, needs, cfg)
