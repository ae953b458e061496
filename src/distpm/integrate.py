"""FastPM kick-drift-kick integrator (Feng et al. 2016) and its adjoint.

Equations of motion in the scale factor a, with canonical momentum
p = a^2 dx/dt [H0 Mpc/h] and the PM force F (see :mod:`distpm.gravity`):

    dx/da = p / (a^3 E(a)),        dp/da = F / (a^2 E(a)).

FastPM replaces the integrals of 1/(a^3 E) and 1/(a^2 E) over a step by
growth-based factors that make the Zel'dovich (linear) motion exact:

    drift a0 -> a1, momentum at ac:  dx = p(ac) [D1(a1) - D1(a0)] / Gp(ac)
    kick  a0 -> a1, force at af:     dp = F(af) [Gp(a1) - Gp(a0)] / Gf(af)

with Gp(a) = a^2 E(a) f1(a) D1(a) (so that p = Gp s in linear theory) and
Gf(a) = a^2 E(a) dGp/da = 1.5 Omega_m D1(a). A step i from a_i to a_{i+1}
kicks to the midpoint ac, drifts to a_{i+1}, recomputes the force and kicks
to a_{i+1}. The midpoint is the arithmetic (linear_a) or geometric (log_a)
mean.

The kick that ends step i and the kick that starts step i + 1 use the same
force, so they are merged (K2_i + K1_{i+1}): between steps the particles
carry only positions and momenta, no force. The momenta are then kicked
ahead to the next step's midpoint; the state is synchronised (momenta at
the positions' time) at the start, where step 0's K1 is applied with a
first force, and at the end of a run or segment, whose last step kicks by
K2 alone.

Gradients: ``adjoint="reverse"`` (default) runs the steps backwards in time
in the backward pass, recovering each earlier state from the later one, so
memory does not grow with the number of steps; ``adjoint="checkpoint"``
differentiates the scan with ``jax.checkpoint`` around each step.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

from distpm import background
from distpm.gravity import force
from distpm.parallel import migrate as parallel_migrate
from distpm.state import Particles, wrap


def step_factors(cosmo, cfg):
    """Kick and drift factors of every step of ``cfg.time_grid``, shape (len(time_grid) - 1, 3).

    The time grid holds the ``n_steps`` steps plus any snapshot times in between.

    Columns (K1, D, K2): K1 kicks a_i -> ac with F(a_i), D drifts a_i -> a_{i+1}
    with p(ac), K2 kicks ac -> a_{i+1} with F(a_{i+1}). Differentiable in ``cosmo``.
    """
    a = np.asarray(cfg.time_grid, dtype=float)
    a0, a1 = a[:-1], a[1:]
    ac = np.sqrt(a0 * a1) if cfg.time_stepping == "log_a" else 0.5 * (a0 + a1)
    table = background.growth_table(cosmo)

    def gp_gf(a):
        d1, f1, _, _ = background.growth(a, table)
        return a**2 * background.E(a, cosmo) * f1 * d1, 1.5 * cosmo.Omega_m * d1, d1

    gp0, gf0, d0 = gp_gf(a0)
    gpc, _, _ = gp_gf(ac)
    gp1, gf1, d1 = gp_gf(a1)
    factors = jnp.stack([(gpc - gp0) / gf0, (d1 - d0) / gpc, (gp1 - gpc) / gf1], axis=-1)
    return factors.astype(cfg.float_dtype)


def merged_kicks(factors):
    """(n, 2) columns (D, K) of the steps with merged kicks: K_i = K2_i + K1_{i+1}, and K2
    alone for the last step of ``factors`` (n, 3) from :func:`step_factors`."""
    k1_next = jnp.concatenate([factors[1:, 0], jnp.zeros_like(factors[:1, 0])])
    return jnp.stack([factors[:, 1], factors[:, 2] + k1_next], axis=-1)


def migrate(pos, vel, ints, mask, layout, cfg):
    """Send particles to the owners of their positions (see :mod:`distpm.parallel.migrate`).

    ints: tuple of (n,) or (n, k) int32 arrays that travel with the particles.
    Returns (pos, vel, ints, mask, needs).
    """
    (pos, vel), ints, mask, needs = parallel_migrate.by_position(
        [pos, vel], list(ints), mask, 0, layout, cfg.cell_size, cfg.exchange_size,
        cfg.neighbour_size,
    )  # fmt: skip
    return pos, vel, tuple(ints), mask, needs


def kick(pos, vel, ints, mask, k, cosmo, layout, cfg):
    """Migrate particles to their owners and kick them by ``k`` with the force at their
    positions. Returns (pos, vel, ints, mask, needs)."""
    pos, vel, ints, mask, needs = migrate(wrap(pos, cfg.box_size), vel, ints, mask, layout, cfg)
    return pos, force(pos, mask, cosmo, layout, cfg, kick=(vel, k)), ints, mask, needs


def drift_kick(carry, factors, cosmo, layout, cfg):
    """One step of merged kicks: drift, migrate, kick with the force at the new positions.

    carry: (pos, vel, ints, mask, needs), ``vel`` kicked to the step's
    midpoint; factors: (D, K) of the step (:func:`merged_kicks`), not the
    (K1, D, K2) of :func:`step_factors` (refused).
    """
    if jnp.shape(factors) != (2,):
        raise ValueError(
            f"a step takes its (D, K) factors (a row of distpm.integrate.merged_kicks), "
            f"got an array of shape {jnp.shape(factors)}"
        )
    pos, vel, ints, mask, needs = carry
    factors = jnp.asarray(factors, pos.dtype)
    pos = pos + factors[0] * vel
    pos, vel, ints, mask, step_needs = kick(pos, vel, ints, mask, factors[1], cosmo, layout, cfg)
    return pos, vel, ints, mask, jnp.maximum(needs, step_needs)


def _scan_steps(carry, factors, cosmo, layout, cfg, checkpoint=False, light=()):
    """Scan :func:`drift_kick` over the (D, K) ``factors``; with ``light`` also record the
    lightcone.

    light: () or (recorder, shells, tables, maps): each drift adds the raw
    maps of the particles it moves to ``maps`` (``recorder.add``, see
    :mod:`distpm.lightcone.record`). Returns (carry, maps).
    """

    def body(state, xs):
        carry, maps = state
        f, shell = xs
        if light:
            pos, vel, _, mask, _ = carry
            recorder, _, tab, _ = light
            maps = recorder.add(maps, pos, f[0] * vel, mask, shell, tab, cosmo)
        return (drift_kick(carry, f, cosmo, layout, cfg), maps), None

    if checkpoint:
        body = jax.checkpoint(body)
    shells = light[1] if light else jnp.zeros((factors.shape[0], 0), factors.dtype)
    maps = light[3] if light else ()
    (carry, maps), _ = jax.lax.scan(body, (carry, maps), (factors, shells))
    return carry, maps


@functools.partial(jax.custom_vjp, nondiff_argnums=(7, 8, 9))
def _reverse_adjoint_steps(pos, w, ids, mask, factors, cosmo, light, layout, cfg, recorder):
    carry = (pos, w, (ids,), mask, parallel_migrate.no_needs())
    light = _light(recorder, light)
    carry, maps = _scan_steps(carry, merged_kicks(factors), cosmo, layout, cfg, light=light)
    pos, vel, (ids,), mask, needs = carry
    return pos, vel, ids, mask, needs, maps


def _light(recorder, light):
    """(recorder, shells, tables, maps) from the differentiable part, or () without a recorder."""
    return (recorder, *light) if recorder is not None else ()


def _reverse_fwd(pos, w, ids, mask, factors, cosmo, light, layout, cfg, recorder):
    # each particle's starting slot travels with it, to send the gradients home
    home = parallel_migrate.home_slots(layout, mask.shape[0])
    carry = (pos, w, (ids, home), mask, parallel_migrate.no_needs())
    steps = merged_kicks(factors)
    out, maps = _scan_steps(carry, steps, cosmo, layout, cfg, light=_light(recorder, light))
    pos, vel, (ids, home), mask_end, needs = out
    residuals = (pos, vel, home, mask_end, factors, cosmo, light[:2] if light else ())
    return (pos, vel, ids, mask_end, needs, maps), residuals


def _reverse_bwd(layout, cfg, recorder, residuals, cotangents):
    """Backpropagate through the steps while integrating back in time.

    Iteration j (from the last force evaluation back to the first) holds
    pos_j and w_j, the momentum after all kicks that use F(pos_j), and the
    cotangents of both. It evaluates F at pos_j together with its VJP, undoes
    the kicks with F(pos_j) and the drift that led to pos_j, and migrates
    the particles (with their cotangents) to the owners of the earlier
    positions. At the end each particle's cotangents go back to the slot it
    started in. With a lightcone, the maps are a sum over the drifts, so
    every drift receives the maps' cotangent: its VJP is taken where the
    drift is undone, at the positions and momenta the drift started from.
    The first step's K1 was applied before (by the caller, with its own
    force): its factor's cotangent is zero here.
    """
    pos, vel, home, mask, factors, cosmo, light = residuals
    g_pos, g_vel = cotangents[:2]
    g_maps = cotangents[5]
    k1, drift, k2 = factors[:, 0], factors[:, 1], factors[:, 2]
    k1_next = jnp.concatenate([k1[1:], jnp.zeros_like(k1[:1])])
    zeros = lambda tree: jax.tree.map(jnp.zeros_like, tree)  # noqa: E731
    shells, tab = light if light else (jnp.zeros((factors.shape[0], 0), factors.dtype), ())
    carry = (pos, vel, g_pos, g_vel, zeros(cosmo), zeros(tab), home, mask)
    carry = (*carry, parallel_migrate.no_needs())

    def body(carry, xs):
        pos, w, g_pos, g_w, g_cosmo, g_tab, home, mask, needs = carry
        d_i, k2_i, k1_n, shell = xs
        acc, force_vjp = jax.vjp(
            lambda p, c: force(p, mask, c, layout, cfg, split=False), pos, cosmo
        )
        both = k2_i + k1_n  # both kicks that used F(pos_j)
        vel_half = w - both * acc
        g_kick = jnp.sum(g_w * acc)
        g_pos_f, g_cosmo_f = force_vjp(both * g_w)
        g_pos = g_pos + g_pos_f
        g_cosmo = jax.tree.map(jnp.add, g_cosmo, g_cosmo_f)
        g_drift = jnp.sum(g_pos * vel_half)
        g_w = g_w + d_i * g_pos
        pos = wrap(pos - d_i * vel_half, cfg.box_size)
        g_shell = jnp.zeros_like(shell)
        if recorder is not None:

            def seen(p, dx, sh, tb, c):  # the maps' cotangent passes through unchanged
                return recorder.add(zeros(g_maps), p, dx, mask, sh, tb, c)

            _, seen_vjp = jax.vjp(seen, pos, d_i * vel_half, shell, tab, cosmo)
            g_p, g_dx, g_shell, g_tb, g_c = seen_vjp(g_maps)
            # this device's share of the drift factor's cotangent (summed over devices below)
            g_drift = g_drift + jnp.sum(g_dx * vel_half)
            g_pos, g_w = g_pos + g_p, g_w + d_i * g_dx
            g_tab = jax.tree.map(jnp.add, g_tab, g_tb)
            g_cosmo = jax.tree.map(jnp.add, g_cosmo, g_c)
        (pos, vel_half, g_pos, g_w), (home,), mask, step_needs = parallel_migrate.by_position(
            [pos, vel_half, g_pos, g_w], [home], mask, 0, layout, cfg.cell_size,
            cfg.exchange_size, cfg.neighbour_size,
        )  # fmt: skip
        needs = jnp.maximum(needs, step_needs)
        out = (pos, vel_half, g_pos, g_w, g_cosmo, g_tab, home, mask, needs)
        return out, (g_kick, g_drift, g_shell)

    xs = (drift, k2, k1_next, shells)
    carry, (g_kick, g_drift, g_shells) = jax.lax.scan(body, carry, xs, reverse=True)
    _, _, g_pos0, g_w0, g_cosmo, g_tab, home, mask, needs = carry
    (g_pos0, g_w0), _, _, home_needs = parallel_migrate.by_slot(
        [g_pos0, g_w0], [], mask, home, layout, cfg.exchange_size
    )
    parallel_migrate.check_later(layout.device_max(jnp.maximum(needs, home_needs)), cfg)
    g_kick, g_drift = layout.device_sum(jnp.stack([g_kick, g_drift]))
    g_k1 = jnp.concatenate([jnp.zeros_like(g_kick[:1]), g_kick[:-1]])
    g_factors = jnp.stack([g_k1, g_drift, g_kick], axis=-1).astype(factors.dtype)
    g_light = (g_shells, g_tab, g_maps) if recorder is not None else ()
    return g_pos0, g_w0, None, None, g_factors, g_cosmo, g_light


_reverse_adjoint_steps.defvjp(_reverse_fwd, _reverse_bwd)


def run_steps(state: Particles, factors, cosmo, layout, cfg, a_end, light=()):
    """Apply the steps with the given factors to ``state``; return (state at a_end, needs, maps).

    state: synchronised particles (momenta at ``state.a``), in any slots of
    any device; they are sent to their owners and kicked by the first K1
    with their force (one force more than the steps) before the steps. The
    result is synchronised. needs: int32 [capacity, exchange] slots this
    device needed (see :func:`distpm.parallel.migrate.check`). light: () or
    (recorder, shells, tables, maps) to record the lightcone (see
    :func:`_scan_steps`); maps is () without it, else this device's maps
    added to the given ones.
    """
    ints = (state.ids,)
    pos, w, (ids,), mask, needs = kick(
        state.pos, state.vel, ints, state.mask, factors[0, 0], cosmo, layout, cfg
    )
    if cfg.adjoint == "reverse":
        recorder, rest = (light[0], light[1:]) if light else (None, ())
        pos, vel, ids, mask, step_needs, maps = _reverse_adjoint_steps(
            pos, w, ids, mask, factors, cosmo, rest, layout, cfg, recorder
        )
    else:
        carry = (pos, w, (ids,), mask, needs)
        steps = merged_kicks(factors)
        carry, maps = _scan_steps(carry, steps, cosmo, layout, cfg, checkpoint=True, light=light)
        pos, vel, (ids,), mask, step_needs = carry
    a = jnp.asarray(a_end, pos.dtype)
    state = Particles(pos=pos, vel=vel, ids=ids, mask=mask, a=a)
    return state, jnp.maximum(needs, step_needs), maps


def segments(cfg) -> list[tuple[int, int]]:
    """Index ranges of the time grid between consecutive outputs (snapshots, a_stop)."""
    grid = cfg.time_grid
    ends = sorted({int(np.argmin(np.abs(grid - a))) for a in (*cfg.snapshots, cfg.a_stop)})
    starts = [0, *ends[:-1]]
    return list(zip(starts, ends, strict=True))
