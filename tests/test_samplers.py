"""The field-level example's samplers (``examples/samplers.py``): each counts the gradients
BlackJAX evaluates, which the samplers' benchmark divides by effective sample sizes, and
each samples a Gaussian whose widths span two decades (the tuning finds them); MCLMC's and
MAMS's integrator step, written as a loop, moves as BlackJAX's."""

import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import samplers  # noqa: E402

SCALES = np.geomspace(0.1, 10, 50)


@pytest.mark.parametrize("name", samplers.SAMPLERS)
def test_sampler_counts_its_gradients_and_samples_a_gaussian(name):
    evaluations = []

    def logp(x):  # each evaluation (with its gradient) calls back once
        jax.debug.callback(lambda: evaluations.append(1))
        return -0.5 * jnp.sum((x / SCALES) ** 2)

    warm_up = jax.jit(lambda key, x: samplers.warm_up(name, key, logp, x, 400))
    state, tuned, gradients = warm_up(jax.random.key(0), jnp.ones(len(SCALES)))
    jax.effects_barrier()
    assert int(gradients) == len(evaluations)

    evaluations.clear()
    step = jax.jit(lambda key, state, tuned: samplers.step(name, key, state, tuned, logp))
    xs, gradients = [], 0
    for key in jax.random.split(jax.random.key(1), 2000):
        state, _, taken = step(key, state, tuned)
        xs.append(np.asarray(state.position))
        gradients += int(taken)
    jax.effects_barrier()
    assert gradients == len(evaluations)

    xs = np.array(xs)
    assert abs(np.median(xs.var(0) / SCALES**2) - 1) < 0.1
    assert np.abs(xs.mean(0) / SCALES).max() < 0.5  # means to within half a width


def test_the_looped_mclachlan_step_is_blackjax_s():
    """MCLMC's and MAMS's integrator step, written as a loop of two turns (one gradient in
    the program), moves as BlackJAX's isokinetic McLachlan step: position, momentum, log
    density, gradient and kinetic energy change, over five steps of a non-Gaussian target
    with a diagonal preconditioner."""
    from blackjax.mcmc import integrators, mclmc

    def logp(x):
        return -0.5 * jnp.sum((x["a"] - 1) ** 2 * jnp.arange(1, 6)) - 0.25 * jnp.sum(x["b"] ** 4)

    imm = jnp.linspace(0.5, 2.0, 7)
    ours = jax.jit(samplers.mclachlan(logp, imm))
    theirs = jax.jit(integrators.isokinetic_mclachlan(logp, imm))
    state = mclmc.init({"a": jnp.linspace(-1, 1, 5), "b": jnp.array([0.3, -0.2])}, logp,
                       jax.random.key(0))  # fmt: skip
    for _ in range(5):
        (new, change), (old, expected) = ours(state, 0.3), theirs(state, 0.3)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), new, old)
        np.testing.assert_allclose(change, expected, rtol=1e-6)
        assert float(jnp.abs(old.position["a"] - state.position["a"]).max()) > 1e-3  # it moves
        state = old
