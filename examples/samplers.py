"""The field-level example's samplers: BlackJAX's NUTS, MCLMC and MAMS behind one interface.

Each is tuned by its own warm-up and then steps. Both report how many gradients of log p
they evaluated, so that samplers compare by gradients per effective sample, the cost that
grows with the simulation:

- ``nuts``: Stan's window adaptation (step size and a diagonal mass matrix), then NUTS,
  whose trajectories take at most 2^max_doublings - 1 leapfrog steps (a gradient each).
- ``mclmc``: the microcanonical Langevin sampler (Robnik et al. 2023). It has no
  accept/reject step: its bias is set by the energy error its tuning allows (BlackJAX's
  ``mclmc_find_L_and_step_size``: step size, momentum decoherence length L and a
  diagonal preconditioner). One step of McLachlan's integrator takes two gradients.
- ``mams``: the Metropolis-adjusted microcanonical sampler (Robnik et al. 2025), unbiased;
  BlackJAX's ``adjusted_mclmc_find_L_and_step_size`` tunes the step size to an acceptance
  of ``MAMS_ACCEPTANCE`` and a diagonal preconditioner; each proposal takes a random number
  of integrator steps with mean L / step size.

    state, tuned, gradients = warm_up(name, key, logp, position, steps, max_doublings)
    state, acceptance, gradients = step(name, key, state, tuned, logp, max_doublings)

``tuned`` is a dict of arrays (it goes into a compiled step as an argument); ``steps`` is
the warm-up's length in sampler steps, which BlackJAX spreads over its tuning stages for
MCLMC (an integrator step each) and MAMS (a proposal each, of several integrator steps).
MCLMC's acceptance is NaN: it has none.

MCLMC and MAMS integrate with :func:`mclachlan`, BlackJAX's isokinetic McLachlan step
written as a loop, so that each compiled program holds the gradient of log p once per
integrator step instead of twice (the same arithmetic; compile time is most of a short run).
"""

import blackjax
import jax
import jax.numpy as jnp
from blackjax.mcmc import integrators
from blackjax.mcmc.adjusted_mclmc import rescale

SAMPLERS = ("nuts", "mclmc", "mams")
MAMS_ACCEPTANCE = 0.9  # the MAMS paper's choice for its step size
GRADIENTS_PER_STEP = 2  # McLachlan's integrator (MCLMC, MAMS): two force evaluations
# BlackJAX's tuning spends these fractions of its num_steps: MCLMC 0.1 + 0.1 + 0.1 and MAMS
# 0.1 + 0.1, the second stage a third longer with a diagonal preconditioner
_TUNING_SHARE = {"mclmc": 0.3, "mams": 0.2}
# the diagonal preconditioner is the variances over the second stage's steps: from fewer
# than about 30 they are noise (round-off even makes some negative: a NaN step), so a
# shorter warm-up (a smoke run's) tunes without it
_PRECONDITION_FROM = 100  # warm-up steps (MCLMC's second stage: 30 of them)


def mclachlan(logdensity_fn, inverse_mass_matrix=1.0):
    """BlackJAX's ``isokinetic_mclachlan`` (momentum b1, position 1/2, momentum 1 - 2 b1,
    position 1/2, momentum b1) as two turns of (momentum, position and its gradient) and
    the closing momentum update: one gradient in the program, two evaluated."""
    momentum_update = integrators.esh_dynamics_momentum_update_one_step(inverse_mass_matrix)
    position_update = integrators.euclidean_position_update_fn(logdensity_fn)
    b1, a1, b2, _, _ = integrators.mclachlan_coefficients

    def one_step(state, step_size):
        dtype = jnp.result_type(state.logdensity)

        def turn(i, carry):
            position, momentum, logdensity, grad, kinetic = carry
            coef = jnp.asarray([b1, b2], dtype)[i]
            momentum, velocity, kinetic = momentum_update(momentum, grad, step_size, coef, kinetic)
            position, logdensity, grad, _ = position_update(position, velocity, step_size, a1)
            return position, momentum, logdensity, grad, kinetic

        zero = jnp.zeros((), dtype)  # the first momentum update adds it: the same sum
        carry = (state.position, state.momentum, state.logdensity, state.logdensity_grad, zero)
        position, momentum, logdensity, grad, change = jax.lax.fori_loop(0, 2, turn, carry)
        momentum, _, change = momentum_update(momentum, grad, step_size, b1, change, True)
        return integrators.IntegratorState(position, momentum, logdensity, grad), change

    return one_step


def _integration_steps(key, avg):
    """MAMS's proposal length: ceil(U * s) integrator steps, s such that the mean is avg."""
    return jnp.ceil(jax.random.uniform(key) * rescale(avg))


def _tuning(name, steps):
    """BlackJAX's tuning arguments for a warm-up of ``steps`` sampler steps."""
    precondition = steps >= _PRECONDITION_FROM
    share = _TUNING_SHARE[name] + (0.1 / 3 if precondition else 0)
    return {"num_steps": round(steps / share), "diagonal_preconditioning": precondition}


def warm_up(name, key, logp, position, steps: int, max_doublings: int = 5):
    """(state, tuned, gradients of the warm-up) of sampler ``name`` from ``position``."""
    k_init, k_tune = jax.random.split(key)
    if name == "nuts":
        adapt = blackjax.window_adaptation(blackjax.nuts, logp, max_num_doublings=max_doublings)
        (state, tuned), info = adapt.run(k_tune, position, num_steps=steps)
        tuned = {key: tuned[key] for key in ("step_size", "inverse_mass_matrix")}
        return state, tuned, jnp.sum(info.info.num_integration_steps) + 1  # + the start's
    if name == "mclmc":
        state = blackjax.mcmc.mclmc.init(position, logp, k_init)
        state, params, n_steps = blackjax.mclmc_find_L_and_step_size(
            blackjax.mcmc.mclmc.build_kernel(integrator=mclachlan),
            state=state,
            rng_key=k_tune,
            logdensity_fn=logp,
            **_tuning("mclmc", steps),
        )
    elif name == "mams":
        state = blackjax.adjusted_mclmc_dynamic.init(position, logp, k_init)
        state, params, n_steps = blackjax.adjusted_mclmc_find_L_and_step_size(
            blackjax.adjusted_mclmc_dynamic.build_kernel(
                integrator=mclachlan, integration_steps_fn=_integration_steps
            ),
            logp,
            state=state,
            rng_key=k_tune,
            target=MAMS_ACCEPTANCE,
            **_tuning("mams", steps),
        )
    else:
        raise ValueError(f"sampler must be one of {SAMPLERS}, got {name!r}")
    tuned = {
        "step_size": params.step_size,
        "L": params.L,
        "inverse_mass_matrix": params.inverse_mass_matrix,
    }
    return state, tuned, GRADIENTS_PER_STEP * n_steps + 1  # + 1: the first state's


def step(name, key, state, tuned, logp, max_doublings: int = 5):
    """One step of sampler ``name``: (state, acceptance, gradients it took)."""
    if name == "nuts":
        nuts = blackjax.nuts(logp, **tuned, max_num_doublings=max_doublings)
        state, info = nuts.step(key, state)
        return state, info.acceptance_rate, info.num_integration_steps
    if name == "mclmc":
        state, _ = blackjax.mclmc(logp, **tuned, integrator=mclachlan).step(key, state)
        return state, jnp.nan, GRADIENTS_PER_STEP
    mams = blackjax.adjusted_mclmc_dynamic(
        logp,
        tuned["step_size"],
        inverse_mass_matrix=tuned["inverse_mass_matrix"],
        integrator=mclachlan,
        integration_steps_fn=_integration_steps,
        integration_steps_params=(tuned["L"] / tuned["step_size"],),
    )
    state, info = mams.step(key, state)
    return state, info.acceptance_rate, GRADIENTS_PER_STEP * info.num_integration_steps
