"""The one step loop: kick-drift-kick steps of a :class:`~distpm.nbody.schedule.Schedule`,
with observers, and its reverse-time adjoint.

Equations of motion in the scale factor a, with canonical momentum
p = a^2 dx/dt [H0 Mpc/h] and the PM force F (see :mod:`distpm.gravity`):

    dx/da = p / (a^3 E(a)),        dp/da = F / (a^2 E(a)),

stepped with growth-based factors (:mod:`distpm.nbody.schedule`: FastPM's, or
the drift-kick-drift steps exact for 2LPT).
Everything here works on one device's particles (inside ``shard_map``).

Gradients: ``adjoint="reverse"`` (default) runs the steps backwards in time
in the backward pass, recovering each earlier state from the later one, so
memory does not grow with the number of steps; ``adjoint="checkpoint"``
differentiates the scan with ``jax.checkpoint`` around each step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

from distpm.gravity import force, force_vjp
from distpm.nbody.observer import observe_all
from distpm.ops.buffers import zeros_after
from distpm.parallel import migrate as parallel_migrate
from distpm.parallel import overflow
from distpm.parallel.decomposition import Decomposition
from distpm.parallel.layout import Layout
from distpm.state import Particles, wrap


def migrate(pos, vel, ints, mask, layout, cfg):
    """Send particles to the owners of their positions (see :mod:`distpm.parallel.migrate`).

    ints: tuple of (n,) or (n, k) int32 arrays that travel with the particles.
    Returns (pos, vel, ints, mask, needs).
    """
    dec = Decomposition.of(cfg)
    (pos, vel), ints, mask, needs = parallel_migrate.by_position(
        [pos, vel], list(ints), mask, 0, layout, cfg.cell_size, dec.exchange_size,
        dec.neighbour_size,
    )  # fmt: skip
    return pos, vel, tuple(ints), mask, needs


def kick(pos, vel, ints, mask, k, cosmo, layout, cfg):
    """Migrate particles to their owners and kick them by ``k`` with the force at their
    positions. Returns (pos, vel, ints, mask, needs)."""
    pos, vel, ints, mask, needs = migrate(wrap(pos, cfg.box_size), vel, ints, mask, layout, cfg)
    return pos, force(pos, mask, cosmo, layout, cfg, kick=(vel, k)), ints, mask, needs


def drift_kick(carry, kicks, cosmo, layout, cfg):
    """One merged step: drift, migrate, scale the momenta and kick them with the force at
    the new positions.

    carry: (pos, vel, ints, mask, needs) as the previous step left them (or
    synchronised and, for FastPM, kicked by the step's K1); kicks: (D, K, S, B) of the
    step (a row of :meth:`Schedule.kicks`), not its five factors (refused).
    """
    if jnp.shape(kicks) != (4,):
        raise ValueError(
            f"a step takes its (D, K, S, B) factors (a row of Schedule.kicks()), "
            f"got an array of shape {jnp.shape(kicks)}"
        )
    pos, vel, ints, mask, needs = carry
    kicks = jnp.asarray(kicks, pos.dtype)
    pos = wrap(pos + kicks[0] * vel, cfg.box_size)
    # the momenta are scaled after they moved (the same values): migrated as they came in,
    # the donated buffers are updated in place, not copied (18 bytes per particle less)
    pos, vel, ints, mask, step_needs = migrate(pos, vel, ints, mask, layout, cfg)
    vel = force(pos, mask, cosmo, layout, cfg, kick=(kicks[2] * vel, kicks[1]))
    return pos, vel, ints, mask, overflow.most(needs, step_needs)


def observe_drift(observers, records, step, pos, vel, kicks, mask, cosmo, layout, cfg):
    """The observers' records after they saw the drift of ``step`` by D = kicks[0] from
    ``pos`` with momenta ``vel``, in its pieces (:func:`distpm.nbody.schedule.drift_knots`):
    FastPM's is piece ``step``. The 2LPT integrator's crosses the step's start a_i: first the
    previous step's second half (piece 2 i - 1, by B = kicks[3]), then this step's first
    half (piece 2 i). After a stop B = 0: the closing drift has shown that piece, and it is
    shown again with every slot masked out (a branch would make a GPU wait on the host).
    The two halves are one loop of two turns: the observers' code is in the program once."""
    d, before = (jnp.asarray(kicks[j], pos.dtype) for j in (0, 3))
    if cfg.integrator == "fastpm":
        return observe_all(observers, records, step, pos, d * vel, mask, cosmo, layout)

    def half(j, records):  # j = 0: piece 2 i - 1 by B from pos; j = 1: piece 2 i from a_i
        first = j == 0
        start = wrap(pos + jnp.where(first, 0, before) * vel, cfg.box_size)
        dx = jnp.where(first, before, d - before) * vel
        seen = mask & ((before > 0) | ~first)
        piece = jnp.where(first, jnp.maximum(2 * step - 1, 0), 2 * step)
        return observe_all(observers, records, piece, start, dx, seen, cosmo, layout)

    return jax.lax.fori_loop(0, 2, half, records)


def observe_closing_drift(observers, records, stop, pos, vel, d, mask, cosmo, layout):
    """The observers' records after they saw the 2LPT integrator's closing half drift by
    ``d`` into the stop a[``stop``] (piece 2 stop - 1)."""
    dx = jnp.asarray(d, pos.dtype) * vel
    return observe_all(observers, records, 2 * stop - 1, pos, dx, mask, cosmo, layout)


def observed_step(carry, records, step, kicks, cosmo, observers, layout, cfg):
    """:func:`drift_kick` after the observers saw the step's drift; (carry, records)."""
    pos, vel, _, mask, _ = carry
    records = observe_drift(observers, records, step, pos, vel, kicks, mask, cosmo, layout, cfg)
    return drift_kick(carry, kicks, cosmo, layout, cfg), records


def _steps(carry, k1, rows, steps, cosmo, observers, records, layout, cfg, checkpoint=False):
    """FastPM's first kick by ``k1`` (None: none), then the merged steps ``rows``
    (:meth:`Schedule.kicks`) with their indices ``steps``."""
    if k1 is not None:
        carry = kick(*carry[:4], k1, cosmo, layout, cfg)

    def body(state, xs):
        kicks, step = xs
        return observed_step(*state, step, kicks, cosmo, observers, layout, cfg), None

    if checkpoint:
        body = jax.checkpoint(body)
    (carry, records), _ = jax.lax.scan(body, (carry, records), (rows, steps))
    return carry, records


@functools.partial(jax.custom_vjp, nondiff_argnums=(10, 11))
def _reverse_adjoint_steps(
    pos, w, ids, mask, k1, rows, steps, cosmo, observers, records, layout, cfg
):
    carry = (pos, w, (ids,), mask, parallel_migrate.no_needs())
    carry, records = _steps(carry, k1, rows, steps, cosmo, observers, records, layout, cfg)
    pos, vel, (ids,), mask, needs = carry
    return pos, vel, ids, mask, needs, records


def _reverse_fwd(pos, w, ids, mask, k1, rows, steps, cosmo, observers, records, layout, cfg):
    # each particle's starting slot travels with it, to send the gradients home
    home = parallel_migrate.home_slots(layout, mask.shape[0])
    carry = (pos, w, (ids, home), mask, parallel_migrate.no_needs())
    out, records = _steps(carry, k1, rows, steps, cosmo, observers, records, layout, cfg)
    pos, vel, (ids, home), mask_end, needs = out
    residuals = (pos, vel, home, mask_end, k1, rows, steps, cosmo, observers)
    return (pos, vel, ids, mask_end, needs, records), residuals


def _unkick(pos, w, g_pos, g_w, g_cosmo, k, s, mask, cosmo, layout, cfg):
    """Undo the kick w = s v + k F(pos): (v, g_pos, g_cosmo, g_k, g_s), this device's
    share of the factors' cotangents; F's VJP adds to those of pos and cosmo. The
    momentum's cotangent before the kick is s g_w."""
    kicked_back, g_pos, g_cosmo_f, g_kick = force_vjp(
        pos, mask, cosmo, g_w, layout, cfg, scale=k, kick=(w, -k), g_pos=g_pos
    )
    vel = kicked_back / s
    g_scale = jnp.sum(g_w * vel)
    return vel, g_pos, jax.tree.map(jnp.add, g_cosmo, g_cosmo_f), g_kick, g_scale


def _reverse_bwd(layout, cfg, residuals, cotangents):
    """Backpropagate through the steps while integrating back in time.

    Iteration j (from the last force evaluation back to the first) holds
    pos_j and w_j, the momentum after the kick that uses F(pos_j), and the
    cotangents of both. It evaluates F at pos_j together with its VJP, undoes
    the kick (w_j = S v + K F(pos_j)) and the drift that led to pos_j, and migrates
    the particles (with their cotangents) to the owners of the earlier
    positions. FastPM's first kick (by K1, before any drift) is undone last, in
    the same way. At the end each particle's cotangents go back to the slot it
    started in. The observers' records are sums over the steps, so every
    step receives the records' cotangent: its VJP is taken where the drift
    is undone, at the positions and momenta the drift started from. The 2LPT
    integrator's closing drift is differentiated by the caller.
    """
    pos, vel, home, mask, k1, rows, steps, cosmo, observers = residuals
    dec = Decomposition.of(cfg)
    for o in observers:
        if not o.differentiable:
            raise ValueError(f"{type(o).__name__} is not differentiable: run without it")
    # plus distinct zeros: a cotangent JAX makes as zeros (a loss that does not read the
    # momenta) is, on a GPU, XLA's one array of zeros of its shape, which every remainder
    # and select of the adjoint then reads: materialised for the loop's carry, it was kept
    # through the whole adjoint (18 bytes per particle on 4x2)
    g_pos, g_vel = (g + zeros_after(g.shape, g.dtype, pos) for g in cotangents[:2])
    g_records = cotangents[5]
    zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)  # noqa: E731
    carry = (pos, vel, g_pos, g_vel, zeros(cosmo), zeros(observers), home, mask)
    carry = (*carry, parallel_migrate.no_needs())

    def body(carry, xs):
        pos, w, g_pos, g_w, g_cosmo, g_obs, home, mask, needs = carry
        row, step = xs
        d_i, k_i, s_i, _ = row  # k_i: the merged kick that used F(pos_j)
        vel_half, g_pos, g_cosmo, g_kick, g_scale = _unkick(
            pos, w, g_pos, g_w, g_cosmo, k_i, s_i, mask, cosmo, layout, cfg
        )
        g_drift = jnp.sum(g_pos * vel_half)
        g_row = jnp.stack([g_drift, g_kick, g_scale, jnp.zeros_like(g_drift)]).astype(w.dtype)
        g_w = s_i * g_w + d_i * g_pos
        pos = wrap(pos - d_i * vel_half, cfg.box_size)
        if observers:

            def seen(p, v, row, obs, c):  # the records' cotangent passes through unchanged
                empty = zeros(g_records)
                return observe_drift(obs, empty, step, p, v, row, mask, c, layout, cfg)

            # the row typed as varying: its cotangent is this device's share (summed over
            # the devices below, with the force's), where JAX would sum it over them here
            _, seen_vjp = jax.vjp(seen, pos, vel_half, Layout.varying(row), observers, cosmo)
            g_p, g_v, g_r, g_o, g_c = seen_vjp(g_records)
            g_row = g_row + g_r.astype(w.dtype)
            g_pos, g_w = g_pos + g_p, g_w + g_v
            g_obs = jax.tree.map(jnp.add, g_obs, g_o)
            g_cosmo = jax.tree.map(jnp.add, g_cosmo, g_c)
        (pos, vel_half, g_pos, g_w), (home,), mask, step_needs = parallel_migrate.by_position(
            [pos, vel_half, g_pos, g_w], [home], mask, 0, layout, cfg.cell_size,
            dec.exchange_size, dec.neighbour_size,
        )  # fmt: skip
        needs = overflow.most(needs, step_needs)
        out = (pos, vel_half, g_pos, g_w, g_cosmo, g_obs, home, mask, needs)
        return out, g_row

    xs = (rows, steps)
    carry, g_rows = jax.lax.scan(body, carry, xs, reverse=True)
    pos, w, g_pos0, g_w0, g_cosmo, g_obs, home, mask, needs = carry
    g_k1 = None
    if k1 is not None:  # the momenta's cotangent passes the first kick (S = 1) unchanged
        one = jnp.ones((), w.dtype)
        _, g_pos0, g_cosmo, g_k1, _ = _unkick(
            pos, w, g_pos0, g_w0, g_cosmo, k1.astype(w.dtype), one, mask, cosmo, layout, cfg
        )
        g_k1 = layout.device_sum(g_k1).astype(k1.dtype)
    (g_pos0, g_w0), _, _, home_needs = parallel_migrate.by_slot(
        [g_pos0, g_w0], [], mask, home, layout, dec.exchange_size
    )
    g_pos0, g_w0 = parallel_migrate.checked(
        (g_pos0, g_w0), layout.device_max(overflow.most(needs, home_needs)), cfg
    )
    g_rows = layout.device_sum(g_rows).astype(rows.dtype)
    return g_pos0, g_w0, None, None, g_k1, g_rows, None, g_cosmo, g_obs, g_records


_reverse_adjoint_steps.defvjp(_reverse_fwd, _reverse_bwd)


def run(state: Particles, sched, cosmo, layout, cfg, observers=(), records=()):
    """Apply the steps of ``sched`` (one that ends at a stop) to ``state``.

    state: synchronised particles (momenta at ``state.a``), in any slots of
    any device. FastPM sends them to their owners and kicks them by the first
    K1 with their force (one force more than the steps) before the steps; the
    2LPT integrator drifts them by the last D2 after the steps and sends them
    to their owners. Returns (state at the schedule's end, synchronised;
    needs: {"capacity", "exchange"}: the int32 slots this device needed, see
    :func:`distpm.parallel.migrate.check`; the observers' records).
    """
    k1 = sched.factors[0, 0] if sched.kicks_first else None
    rows = sched.kicks()
    steps = sched.first + jnp.arange(sched.n_steps, dtype=jnp.int32)
    if cfg.adjoint == "reverse":
        pos, vel, ids, mask, needs, records = _reverse_adjoint_steps(
            state.pos, state.vel, state.ids, state.mask, k1, rows, steps, cosmo, observers,
            records, layout, cfg,
        )  # fmt: skip
    else:
        carry = (state.pos, state.vel, (state.ids,), state.mask, parallel_migrate.no_needs())
        carry, records = _steps(
            carry, k1, rows, steps, cosmo, observers, records, layout, cfg, checkpoint=True
        )
        pos, vel, (ids,), mask, needs = carry
    if not sched.kicks_first:  # the closing half drift (seen by the observers), then the owners
        d = sched.closing_drift(sched.n_steps - 1).astype(pos.dtype)
        stop = sched.first + sched.n_steps
        records = observe_closing_drift(observers, records, stop, pos, vel, d, mask, cosmo, layout)
        pos = pos + d * vel
        pos, vel, (ids,), mask, drift_needs = migrate(
            wrap(pos, cfg.box_size), vel, (ids,), mask, layout, cfg
        )
        needs = overflow.most(needs, drift_needs)
    a = jnp.asarray(sched.a[-1], pos.dtype)
    state = Particles(pos=pos, vel=vel, ids=ids, mask=mask, a=a)
    return state, needs, records
