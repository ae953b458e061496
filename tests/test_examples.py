"""Every script in examples/ runs at tiny size (``--smoke``), writes its plot, and says what
it found: the examples cannot rot."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = sorted((Path(__file__).resolve().parents[1] / "examples").glob("*.py"))


def _run(script, out):
    env = dict(os.environ, JAX_PLATFORMS="cpu")
    result = subprocess.run(
        [sys.executable, str(script), "--smoke", "--out", str(out)],
        capture_output=True, text=True, timeout=600, env=env, cwd=out,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert list(out.glob("*.png")), "no plot written"
    return result.stdout


def test_every_example_is_tested():
    assert {p.stem for p in EXAMPLES} == {
        "reconstruct_initial_conditions", "growth_in_redshift_space",
    }  # fmt: skip


@pytest.mark.parametrize("script", EXAMPLES, ids=lambda p: p.stem)
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
