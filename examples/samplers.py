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
"""

import blackjax
import jax
import jax.numpy as jnp
from blackjax.mcmc.adjusted_mclmc import rescale

SAMPLERS = ("nuts", "mclmc", "mams")
MAMS_ACCEPTANCE = 0.9  # the MAMS paper's choice for its step size
GRADIENTS_PER_STEP = 2  # McLachlan's integrator (MCLMC, MAMS): two force evaluations
# BlackJAX's MCLMC tuning spends these fractions of its num_steps (the second grows by a
# third with a diagonal preconditioner): 0.1 + 0.1 * 4 / 3 + 0.1 = 1 / 3 of num_steps
_MCLMC_TUNING_SHARE = 1 / 3
_MAMS_TUNING_SHARE = 0.2 + 0.1 / 3  # 0.1 + 0.1 * 4 / 3 (no third stage)


def _integration_steps(key, avg):
    """MAMS's proposal length: ceil(U * s) integrator steps, s such that the mean is avg."""
    return jnp.ceil(jax.random.uniform(key) * rescale(avg))


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
            blackjax.mcmc.mclmc.build_kernel(),
            num_steps=round(steps / _MCLMC_TUNING_SHARE),
            state=state,
            rng_key=k_tune,
            logdensity_fn=logp,
        )
    elif name == "mams":
        state = blackjax.adjusted_mclmc_dynamic.init(position, logp, k_init)
        state, params, n_steps = blackjax.adjusted_mclmc_find_L_and_step_size(
            blackjax.adjusted_mclmc_dynamic.build_kernel(integration_steps_fn=_integration_steps),
            logp,
            num_steps=round(steps / _MAMS_TUNING_SHARE),
            state=state,
            rng_key=k_tune,
            target=MAMS_ACCEPTANCE,
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
        state, _ = blackjax.mclmc(logp, **tuned).step(key, state)
        return state, jnp.nan, GRADIENTS_PER_STEP
    mams = blackjax.adjusted_mclmc_dynamic(
        logp,
        tuned["step_size"],
        inverse_mass_matrix=tuned["inverse_mass_matrix"],
        integration_steps_fn=_integration_steps,
        integration_steps_params=(tuned["L"] / tuned["step_size"],),
    )
    state, info = mams.step(key, state)
    return state, info.acceptance_rate, GRADIENTS_PER_STEP * info.num_integration_steps
