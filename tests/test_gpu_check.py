"""The GPU check (benchmarks/gpu/check.sh) at tiny sizes on the CPU, so that it cannot rot:
every measurement runs and says what the issue asks of it."""

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

from conftest import third_party

ROOT = Path(__file__).resolve().parents[1]


def test_the_gpu_check_runs_every_step_on_the_cpu(tmp_path):
    pmwd = third_party("pmwd-*.tar.gz")
    carry = tmp_path / "carry"  # pmwd's source, as prepare.sh lays it out (mcfit is installed)
    (carry / "src").mkdir(parents=True)
    with tarfile.open(pmwd) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith("pmwd/pmwd/")]
        for m in members:
            m.name = m.name.removeprefix("pmwd/")
        tar.extractall(carry / "src", members, filter="data")
    out = tmp_path / "out"
    env = {**os.environ, "PYTHON": sys.executable}
    env.pop("XLA_FLAGS", None)  # one CPU device, as on the GPU machine
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu" / "check.sh"), "--smoke", "--carry", str(carry)],
        env={**env, "OUT": str(out)}, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (out / "check.jsonl").read_text().splitlines()]
    steps = [r["step"] for r in records]
    assert steps[0] == "start" and steps[-1] == "end" and records[-1]["left_s"] > 0
    for r in records[1:-1]:
        if r["step"] == "tests":  # counts, below
            continue
        if r["step"] == "jztree":  # CUDA only: says so on the CPU
            assert "needs a CUDA device" in r["skipped"], r
            continue
        assert "failed" not in r and "skipped" not in r, r
    problems = [r for r in records if r["step"] in ("distpm:problem", "pmwd")]
    assert {r["code"] for r in problems} == {"distpm", "pmwd"} and len(problems) == 7
    for r in problems:
        assert r["finite"] and r["bitwise_repeats"] and r["median_s"] > 0, r
    by_step = {r["step"]: r for r in records}
    assert by_step["distpm:env"]["backend"] == "cpu"
    deterministic = [r for r in problems if r.get("deterministic")]
    assert len(deterministic) == 1 and deterministic[0]["options"]["n"] == 16
    compared = by_step["distpm:compare"]
    assert compared["noise_bitwise"] and compared["fof_labels_equal"]
    assert compared["density_max_rel_diff"] == 0.0  # CPU against CPU here
    plan = by_step["distpm:plan"]
    assert plan["planned_bytes"] == max(plan["programs"].values()) > 0
    halos = by_step["distpm:halos"]
    assert halos["n_groups_2"] > 0 and 0 < halos["mean_kth_distance"] < 2 * halos["box"] / 16
    lightcone = by_step["distpm:lightcone"]
    assert lightcone["recording"]["median_s"] > 0 and lightcone["plain"]["median_s"] > 0
    tests = by_step["tests"]
    assert tests["passed"] > 0 and tests["failed"] == 0 and tests["error"] == 0, tests
    for mode in ("forward", "gradient"):
        assert by_step[f"largest:{mode}"]["largest_n"] == 16
