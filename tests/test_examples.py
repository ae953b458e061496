"""Every script in examples/ runs at tiny size (``--smoke``), writes its plot, and says what
it found: the examples cannot rot."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

# the samplers' thousands of gradients: their runtime dominates (tests/conftest.py)
pytestmark = pytest.mark.full_optimization

# the scripts (examples/samplers.py is a module the field-level example imports)
EXAMPLES = sorted(
    p
    for p in (Path(__file__).resolve().parents[1] / "examples").glob("*.py")
    if 'if __name__ == "__main__":' in p.read_text()
)


def _run(script, out, *options):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    out.mkdir(exist_ok=True)
    result = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(out), *options],
        capture_output=True, text=True, timeout=600, env=env, cwd=out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert list(out.glob("*.png")), "no plot written"
    return result.stdout


def test_every_example_is_tested():
    assert {p.stem for p in EXAMPLES} == {
        "reconstruct_initial_conditions", "growth_in_redshift_space", "field_level_inference",
    }  # fmt: skip


@pytest.mark.parametrize(
    "script", [p for p in EXAMPLES if p.stem != "field_level_inference"], ids=lambda p: p.stem
)
def test_example_runs_at_tiny_size(script, tmp_path):
    out = _run(script, tmp_path)
    if script.stem == "reconstruct_initial_conditions":
        first, last, r = (
            float(x) for x in re.search(r"loss (\S+) -> (\S+); .* (\S+)\n", out).groups()
        )
        assert last < 0.5 * first and r > 0.5, out  # the fit converges towards the truth
    else:
        rows = re.findall(r"^(0\.\d+|1\.000)\s+(\S+)\s+(\S+)$", out, flags=re.M)
        assert len(rows) == 2, out
        for _, measured, linear in rows:  # the largest scales grow as D^2
            assert abs(float(measured) / float(linear) - 1) < 0.02, out


def _field_level(out, *options):
    return _run(next(p for p in EXAMPLES if p.stem == "field_level_inference"), out, *options)


@pytest.fixture(scope="module")
def field_level_one_device(tmp_path_factory):
    """The HMC example at 16^3 (a few sampler steps after a short warm-up) on one device:
    (its folder, what it printed), read by both tests below."""
    out = tmp_path_factory.mktemp("field_level_one_device")
    return out, _field_level(out)


def test_field_level_inference_runs(field_level_one_device):
    """On one device the sampler moves and the posterior-mean noise follows the truth on the
    largest scales."""
    folder, out = field_level_one_device
    one = np.load(folder / "chains.npz")
    assert "R-hat" in out and "truth inside the 95% region" in out, out
    assert np.all(one["acceptance"] > 0.2), one["acceptance"]
    assert np.ptp(one["theta"], axis=1).min() > 1e-4  # every chain moves in both parameters
    r_lowest = float(re.search(r"lowest bins: \[(\S+)", out).group(1))
    assert r_lowest > 0.9, out


@pytest.mark.slow
def test_field_level_inference_gives_the_same_chains_on_2x2(field_level_one_device, tmp_path):
    """The same example on 2x2 makes the same chain as on one device, to float32 round-off,
    and the same NUTS trees: its first chain (a chain's key does not depend on the number
    of chains; the 2x2 run compiles for 3 minutes: `slow`)."""
    out = _field_level(tmp_path, "--devices", "2x2", "--chains", "1")
    assert "R-hat n/a" in out, out
    one, grid = (np.load(d / "chains.npz") for d in (field_level_one_device[0], tmp_path))
    assert grid["theta"].shape[0] == 1 and one["theta"].shape[0] == 2
    np.testing.assert_array_equal(one["gradients"][:1], grid["gradients"])
    np.testing.assert_allclose(one["theta"][:1], grid["theta"], rtol=0, atol=1e-3)


def test_field_level_inference_with_mclmc(tmp_path):
    """The example with MCLMC: its tuning, two gradients per step, no acceptance (NaN in the
    chains, none in the summary), and the gradients per effective sample it prints."""
    out = _field_level(tmp_path, "--sampler", "mclmc", "--chains", "1")
    chains = np.load(tmp_path / "chains.npz")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert np.all(chains["gradients"] == 2) and np.all(np.isnan(chains["acceptance"]))
    assert summary["acceptance"] is None and summary["sampler"] == "mclmc"
    assert summary["tuned"][0]["L"] > 0 and summary["tuned"][0]["step_size"] > 0, summary
    assert np.ptp(chains["theta"], axis=1).min() > 1e-4  # the chain moves in both parameters
    assert "gradients per effective sample" in out, out


def test_field_level_figures_of_a_chain_that_did_not_move(tmp_path):
    """A chain stuck at a prior bound (sigma8 a float32 step above 0.5: BlackJAX's MCLMC
    after a bad warm-up) beside one that mixes: the corner plot's histograms share bins and
    the figures are written (matplotlib's own 25 bins over that range raised ValueError, after
    the whole run)."""
    sys.path.insert(0, str(EXAMPLES[0].parent))
    import field_level_inference as example

    steps = np.where(np.arange(200) % 2, 0.50000024, 0.5000003)
    stuck = np.stack([np.linspace(0.1506, 0.1521, 200), steps], 1)
    moving = np.random.default_rng(0).normal([0.31, 0.8], 0.03, (200, 2))
    thetas = np.array([stuck, moving], np.float32)
    summary = {"truth": [0.311, 0.81], "k": [0.1], "r": [0.9]}
    example.plot(thetas, np.zeros((2, 200, 3)), summary, tmp_path)
    written = {p.name for p in tmp_path.glob("*.png")}
    assert written == {"corner.png", "traces.png", "correlation.png"}


def test_the_logits_jacobian_is_finite_at_any_logit():
    """The log Jacobian of the logits and its gradient: finite far beyond the bounds, where
    float32's 1 - sigmoid(x) is 0 (x >= 17), and log s(1 - s) to float32 round-off."""
    sys.path.insert(0, str(EXAMPLES[0].parent))
    import jax
    import jax.numpy as jnp
    from field_level_inference import PRIOR, from_logits

    x = np.array([-150.0, -30.0, -1.0, 0.0, 2.0, 20.0, 150.0], np.float32)
    for logit in x:
        theta, log_j = from_logits(jnp.asarray([logit, -logit]))
        grad = jax.grad(lambda v: from_logits(v)[1])(jnp.asarray([logit, -logit]))
        exact = -2 * (np.logaddexp(0, logit) + np.logaddexp(0, -logit))  # both entries alike
        assert np.isfinite(float(log_j)) and np.all(np.isfinite(np.asarray(grad))), logit
        np.testing.assert_allclose(float(log_j), exact, rtol=1e-6)
        np.testing.assert_allclose(np.asarray(grad), -np.tanh(np.array([logit, -logit]) / 2),
                                   atol=1e-6)  # fmt: skip
        assert np.all((theta >= PRIOR[:, 0]) & (theta <= PRIOR[:, 1]))


def test_field_level_posterior_is_calibrated_on_a_few_truths():
    """Simulation-based calibration (``benchmarks/calibration.py``, 20 truths there) on three
    truths across the prior, short MCLMC chains at 16^3: the truths' ranks among their
    chains' samples are not all in one tail (KS p > 0.01 against uniform ranks)."""
    import dataclasses

    from scipy import stats

    root = EXAMPLES[0].parents[1]
    sys.path[:0] = [str(root / "examples"), str(root / "benchmarks")]
    import calibration
    import field_level_inference as example

    run = dataclasses.replace(example.SMOKE, sampler="mclmc", chains=1, warmup=100, samples=300)
    truths = np.array([[0.2, 0.7], [0.3, 0.85], [0.42, 0.95]])  # across the prior
    rows = calibration.rank_fractions(example, run, truths)
    fractions = np.array([r["fraction"] for r in rows])
    for j in range(2):
        assert stats.kstest(fractions[:, j], "uniform").pvalue > 0.01, fractions
