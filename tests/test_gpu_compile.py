"""distpm's programs compiled for an H100 on this CPU-only machine (XLA's deviceless GPU
compiler): no host callback in any of them, no loop whose trip count depends on data in the
hot path (step, kick, drift, gradient), the GPU form of every ``by_platform`` choice, float32
products at HIGHEST precision, and XLA's deterministic scatters with the determinism flags.

The compiler comes with jax's CUDA plugin, which a CPU test environment does not hold (its
import prints CUDA's absence on every process's stderr): ``.ci/run`` installs it into
``.gpu-compiler/`` (``pip install --target``), and the programs are compiled in a process of
their own with it on the path (tests/gpu_programs.py). Elsewhere set DISTPM_GPU_COMPILER to
such a folder, or install jax-cuda12-plugin, jax-cuda12-pjrt (jax's version) and
nvidia-cuda-nvcc-cu12 into the environment.
"""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import not_here

# XLA's GPU compiler as a user's run meets it, every optimization on (tests/conftest.py)
pytestmark = pytest.mark.full_optimization

ROOT = Path(__file__).resolve().parents[1]
HOT_PATH = ("step", "kick", "drift", "gradient")


def _compiler_path() -> str | None:
    """The folder to put on the path for XLA's GPU compiler ("" where it is installed)."""
    if importlib.util.find_spec("jax_plugins") and importlib.util.find_spec(
        "jax_plugins.xla_cuda12"
    ):
        return ""
    for folder in (os.environ.get("DISTPM_GPU_COMPILER"), ROOT / ".gpu-compiler"):
        if folder and (Path(folder) / "jax_plugins").is_dir():
            return str(folder)
    return None


def _environment():
    path = _compiler_path()
    if path is None:
        why = (
            "XLA's GPU compiler is not installed: pip install --target .gpu-compiler "
            "jax-cuda12-plugin==0.10.2 jax-cuda12-pjrt==0.10.2 nvidia-cuda-nvcc-cu12 "
            "(as .ci/run does)"
        )
        not_here(why)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (path, env.get("PYTHONPATH", "")) if p)
    env.update(JAX_PLATFORMS="cpu", JAX_SKIP_CUDA_CONSTRAINTS_CHECK="1")
    return env


@pytest.fixture(scope="module")
def programs(tmp_path_factory):
    env = _environment()
    out = tmp_path_factory.mktemp("gpu") / "programs.json"
    script = ROOT / "tests" / "gpu_programs.py"
    done = subprocess.run(
        [sys.executable, str(script), str(out)], env=env, capture_output=True, text=True,
        timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(out.read_text())
    assert result["platform"] == "gpu" and "H100" in result["devices"]
    return result


def _all(programs):
    return [(f"{grid}/{name}", p) for grid in ("1x1", "1x1_2lpt", "2x2")
            for name, p in programs[grid].items()]  # fmt: skip


def test_every_program_compiles_for_cuda_with_no_host_callback(programs):
    names = {name for grid in ("1x1", "1x1_2lpt", "2x2") for name in programs[grid]}
    made = {"initial_conditions", "step", "kick", "drift", "gradient", "output_density",
            "output_power", "fof", "catalogue", "overdensity", "step_observed", "knn",
            "morton_sort", "multipoles", "filter"}  # fmt: skip
    assert made <= names
    assert [name for name, p in _all(programs) if p["host_callbacks"]] == []
    # the reader finds a callback where there is one; XLA refuses to compile it for the GPU
    assert programs["detector"]["callback_on_cpu"]["host_callbacks"] == 1
    assert programs["detector"]["callback_on_gpu"].startswith("RuntimeError")


def test_hot_path_holds_no_loop_whose_trip_count_depends_on_data(programs):
    hot = [(name, p) for name, p in _all(programs) if name.split("/")[1] in HOT_PATH]
    assert len(hot) == 9  # step, kick or drift, gradient on three configurations
    assert [name for name, p in hot if p["data_dependent_loops"]] == []
    # the gradient's loops are there, with trip counts XLA knows ...
    assert all(p["while_loops"] > 0 for name, p in hot if name.endswith("gradient"))
    # ... and the reader sees a loop that depends on data where there is one
    assert programs["detector"]["loop"]["data_dependent_loops"] == 1
    # FoF and kNN (one-off programs) keep theirs
    assert programs["1x1"]["fof"]["data_dependent_loops"] > 0


def test_the_gpu_form_of_every_platform_choice_is_compiled(programs):
    chosen = [c for _, p in _all(programs) for c in p["platform_choices"]]
    assert {c.split(":")[0] for c in chosen} == {"gpu"}
    assert {"gpu:compact_gpu", "gpu:running_sum_gpu", "gpu:running_max_gpu"} <= set(chosen)
    assert programs["2x2"]["step"]["platform_choices"]  # migration compacts on the GPU


def test_float32_products_run_at_highest_precision(programs):
    assert programs["1x1"]["step_observed"]["float_products"] > 0  # the lightcone's products
    assert [name for name, p in _all(programs) if p["float_products_below_highest"]] == []


def test_determinism_flags_make_the_scatters_ordered(programs):
    # painting's mass assignment is a float scatter-add: atomic and unordered by default ...
    assert programs["1x1"]["output_density"]["unordered_float_scatters"] > 0
    # ... and XLA's deterministic form (sorted, unique indices) with the flags
    assert programs["1x1"]["output_density_deterministic"]["unordered_float_scatters"] == 0


def test_plan_for_a_gpu_target_says_what_does_not_fit():
    env = _environment()
    env["XLA_PYTHON_CLIENT_MEM_FRACTION"] = "0.00001"  # a budget of 0.8 MiB: every program is over
    done = subprocess.run(
        [sys.executable, "-m", "distpm.cli.main", "plan", "--target", "h100", "--devices",
         "1x1", "--set", "mesh_shape=32", "--set", "box_size=128", "--set", "n_steps=4"],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert "compiled for 1 x NVIDIA H100 80GB HBM3, not run on them" in lines[0]
    rows = {line.split()[0]: line for line in lines[2:] if line.split()}
    assert {"initial_conditions", "step", "kick", "output_density", "output_power"} <= set(rows)
    assert "0/0/0" in rows["step"]  # no callback, loop on data or conditional on one device
    assert "of the allocator's" in done.stdout and "of the card's 79.10 GiB" in done.stdout
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.95 raises" in done.stdout
