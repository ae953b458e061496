"""The GPU check: every measurement of issue 37 on one GPU, unattended, in a time budget.

Each measurement runs in its own process (its own peak memory, and a crash or
an out-of-memory ends that measurement only) with a time limit; when the
budget is spent the rest are written as skipped. Results: one JSON line per
measurement in ``OUT/check.jsonl`` (and on stdout), each with its step, its
options, its wall time and what the step returned, or why it failed.

    python benchmarks/gpu/check.py --out DIR [--budget 440]    # on the GPU machine
    python benchmarks/gpu/check.py --smoke --out DIR            # every step, tiny, on the CPU

``--carry DIR`` (default ``benchmarks/gpu/carry``, made by ``prepare.sh``)
holds what the GPU machine lacks: pmwd and mcfit as source, jz-tree's wheels
unpacked; it goes on ``PYTHONPATH``. The order puts
the figures the issue asks for first (512^3 forward and 256^3 gradient next to
pmwd, determinism, the plan, GPU against CPU), then the rest.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
PMWD = HERE / "pmwd_problem.py"
JZTREE = HERE / "jztree_problem.py"

# the GPU-able test files, quickest first; tests needing several devices skip there
TESTS = (
    "test_ops.py", "test_painting.py", "test_ic.py", "test_power.py", "test_physics.py",
    "test_cosmology.py", "test_sorting.py", "test_morton.py", "test_integrator.py",
    "test_halos.py", "test_neighbours.py", "test_api.py", "test_lightcone.py",
)  # fmt: skip


def plan_of(smoke: bool) -> list[tuple[str, dict, dict]]:
    """(kind, options, environment) of every measurement, most wanted first. Kinds: a step
    of ``steps.py`` ("distpm:NAME"), "pmwd", "jztree", "tests", "largest:MODE"."""
    big, mid, small, tiny = (16, 16, 16, 8) if smoke else (512, 256, 128, 64)
    det = {"DISTPM_DETERMINISTIC": "1"}
    cpu = {"JAX_PLATFORMS": "cpu", "DISTPM_DETERMINISTIC": "0"}
    work = "{work}"
    quick = 5  # the test files run first; the rest at the end
    # the smoke test runs one short file: the step is tested, not the tests
    first = ("test_cosmology.py",) if smoke else TESTS[:quick]
    out = [("distpm:env", {}, {}), ("tests", {"files": first, "limit_s": 100}, {})]
    for n, mode in ((big, "forward"), (mid, "gradient")):
        for kind in ("distpm:problem", "pmwd"):
            out.append((kind, {"n": n, "mode": mode, "repeats": 2}, {}))
    out += [
        ("distpm:problem", {"n": small, "mode": "forward"}, {}),
        ("distpm:problem", {"n": small, "mode": "forward"}, det),
        ("distpm:plan", {"n": big}, {}),
        ("distpm:reference", {"n": tiny, "path": f"{work}/gpu.npz"}, {}),
        ("distpm:reference", {"n": tiny, "path": f"{work}/cpu.npz"}, cpu),
        ("distpm:fof_labels", {"n": tiny, "positions": f"{work}/gpu.npz",
                               "out": f"{work}/gl.npy"}, {}),
        ("distpm:fof_labels", {"n": tiny, "positions": f"{work}/gpu.npz",
                               "out": f"{work}/cl.npy"}, cpu),
        ("distpm:compare", {"gpu": f"{work}/gpu.npz", "cpu": f"{work}/cpu.npz",
                            "gpu_labels": f"{work}/gl.npy", "cpu_labels": f"{work}/cl.npy"}, cpu),
    ]  # fmt: skip
    out += _halos(small)
    sizes = {"forward": [768, 1024, 1152], "gradient": [384, 512, 640]}
    for mode, tries in sizes.items():
        out.append((f"largest:{mode}", {"sizes": [small] if smoke else tries}, {}))
    # sources at z = 0.5 (1300 Mpc/h) in a box of 1024 Mpc/h; in the smoke test, nearer
    out.append(("distpm:lightcone", {"n": small, "z_source": 0.03 if smoke else 0.5}, {}))
    out.append(("distpm:problem", {"n": big, "mode": "forward", "repeats": 2}, det))
    for n, mesh_factor, mode in ((small, 1, "forward"), (small, 2, "forward"),
                                 (big, 2, "forward"), (small, 1, "gradient")):  # fmt: skip
        if smoke and (n, mesh_factor, mode) != (small, 2, "forward"):
            continue
        for kind in ("distpm:problem", "pmwd"):
            out.append((kind, {"n": n, "mode": mode, "mesh_factor": mesh_factor}, {}))
    if not smoke:
        out += _halos(mid)
        out.append(("tests", {"files": TESTS[quick:]}, {}))
    if smoke:
        for kind, options, _ in out:
            if kind in ("distpm:problem", "pmwd"):
                options.update(steps=2, repeats=2)
        unique = {json.dumps(m, sort_keys=True): m for m in reversed(out)}  # sizes coincide
        out = [m for m in out if unique[json.dumps(m, sort_keys=True)] is m]
    return out


def _halos(n) -> list:
    """distpm's FoF, kNN and Morton sort of an N^3 run, then jz-tree's on the same points."""
    points, box = f"{{work}}/points_{n}.npy", 2.0 * n
    fof = {"points": points, "box": box, "what": "fof", "linking_length": 0.4}  # b = 0.2
    return [
        ("distpm:halos", {"n": n, "points": points}, {}),
        ("jztree", {"points": points, "box": box, "what": "knn", "k": 8}, {}),
        ("jztree", fof, {}),
    ]


class Runner:
    """Runs measurements as processes within a budget; writes each result as a JSON line."""

    def __init__(self, out: Path, budget: float, carry: Path | None, step_limit: float):
        self.out, self.deadline, self.step_limit = out, time.monotonic() + budget, step_limit
        self.work = Path(tempfile.mkdtemp(prefix="distpm-gpu-check-"))
        paths = [str(ROOT / "src"), str(ROOT / "benchmarks")]
        if carry is not None and carry.is_dir():
            paths += [str(_unpack(carry / "wheels", self.work / "site")), str(carry / "src")]
        paths += [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
        self.env.setdefault("JAX_COMPILATION_CACHE_DIR", str(self.work / "xla-cache"))
        self.lines = out / "check.jsonl"

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def write(self, record: dict) -> dict:
        line = json.dumps(record)
        with self.lines.open("a") as f:
            f.write(line + "\n")
        print(line, flush=True)
        return record

    def process(self, command, env_extra, limit=None) -> dict:
        """Run ``command``; its last JSON line on stdout, or why there is none."""
        limit = min(self.left(), limit or self.step_limit)
        if limit < 5:
            return {"skipped": "the check's time budget is spent"}
        t = time.monotonic()
        code, stdout, stderr = _run(command, {**self.env, **env_extra}, limit)
        if code is None:
            return {"failed": f"time limit of {limit:.0f} s", "wall_s": time.monotonic() - t}
        result = {}
        for line in reversed(stdout.splitlines()):
            try:
                result = json.loads(line)
                break
            except ValueError:
                continue
        if not isinstance(result, dict):
            result = {"output": result}
        if code != 0 and "skipped" not in result:
            result["failed"] = f"exit {code}: {stderr.strip()[-1500:]}"
        return {**result, "wall_s": time.monotonic() - t}

    def measure(self, kind: str, options: dict, env_extra: dict) -> dict:
        options = json.loads(json.dumps(options).replace("{work}", str(self.work)))
        py = sys.executable
        if kind.startswith("distpm:"):
            command = [py, str(HERE / "steps.py"), kind.split(":")[1], json.dumps(options)]
        elif kind in ("pmwd", "jztree"):
            script = PMWD if kind == "pmwd" else JZTREE
            command = [py, str(script)] + [
                f"--{k.replace('_', '-')}={v}" for k, v in options.items()
            ]  # fmt: skip
        elif kind == "tests":
            return self.write({"step": kind, **self.tests(**options)})
        else:
            return self.write({"step": kind, **self.largest(kind.split(":")[1], **options)})
        return self.write({"step": kind, "options": options, **self.process(command, env_extra)})

    def tests(self, files, limit_s=None) -> dict:
        """The test files one by one on this platform, as many as ``limit_s`` and the budget
        allow (each leaves 60 s of the budget for the steps after it)."""
        import platform

        counts, per_file = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}, {}
        name = self.env.get("DISTPM_TEST_PLATFORM") or _platform(self.env)
        env = {**self.env, "DISTPM_TEST_PLATFORM": name, "XLA_PYTHON_CLIENT_PREALLOCATE": "false"}
        end = time.monotonic() + (limit_s or self.left())
        for test in files:
            limit = min(self.left() - 60, end - time.monotonic())
            if limit < 10:
                per_file[test] = {"skipped": "the check's time budget is spent"}
                continue
            command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0",
                       "-o", "addopts=-ra", f"tests/{test}"]  # fmt: skip
            code, stdout, stderr = _run(command, env, limit)
            if code is None:
                per_file[test] = {"failed": f"time limit of {limit:.0f} s"}
                continue
            found = _pytest_counts((stdout.strip().splitlines() or [""])[-1])
            per_file[test] = found or {"failed": (stdout + stderr)[-1500:]}
            if code not in (0, 5) or "failed" in found or "error" in found:
                per_file[test]["output"] = (stdout + stderr)[-3000:]
            for key, value in found.items():
                counts[key] = counts.get(key, 0) + value
        python = platform.python_version()
        return {**counts, "files": per_file, "platform": name, "python": python}

    def largest(self, mode: str, sizes) -> dict:
        """The largest N^3 (mesh x1) whose forward or gradient runs, trying sizes in ascending
        order until one fails. Two steps: memory does not grow with the steps (the scan, and
        the reverse-time adjoint), and each try costs a compile and a run."""
        tried = {}
        for n in sizes:
            options = {"n": n, "mode": mode, "repeats": 1, "steps": 2}
            command = [sys.executable, str(HERE / "steps.py"), "problem", json.dumps(options)]
            result = self.process(command, {"XLA_PYTHON_CLIENT_MEM_FRACTION": "0.95"})
            if not ("failed" in result or "skipped" in result or result.get("finite")):
                result["failed"] = "non-finite output"
            tried[n] = result
            if "failed" in result or "skipped" in result:
                break  # out of memory, or of time: the record says which
        ok = [n for n, r in tried.items() if "failed" not in r and "skipped" not in r]
        return {"mode": mode, "largest_n": max(ok) if ok else None, "tried": tried}


def _unpack(wheels: Path, site: Path) -> Path:
    """Every wheel in ``wheels`` unzipped into ``site`` (what pip's install of it does, less
    the scripts and the record), for a Python that cannot install packages."""
    import zipfile

    site.mkdir(parents=True, exist_ok=True)
    for wheel in sorted(wheels.glob("*.whl")):
        with zipfile.ZipFile(wheel) as z:
            z.extractall(site)
    for library in site.rglob("*.so*"):  # zip files keep no permission bits
        library.chmod(0o755)
    return site


def _run(command, env, limit) -> tuple[int | None, str, str]:
    """(exit status, or None past ``limit`` seconds; stdout; stderr) of ``command``, which runs
    in a process group of its own, killed whole at the limit (pytest's children too)."""
    import signal

    with subprocess.Popen(
        command, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    ) as proc:  # fmt: skip
        try:
            stdout, stderr = proc.communicate(timeout=limit)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            stdout, stderr = proc.communicate()
            return None, stdout, stderr
    return proc.returncode, stdout, stderr


def _platform(env) -> str:
    """The platform name JAX_PLATFORMS takes for the default device ("cuda" on an NVIDIA
    GPU: JAX's "gpu" would also ask for ROCm, which fails to start there)."""
    code, stdout, _ = _run(
        [sys.executable, "-c", "import jax; print(jax.default_backend())"], env, 120
    )
    name = stdout.strip() if code == 0 else ""
    return {"gpu": "cuda", "": "cpu"}.get(name, name)


def _pytest_counts(text: str) -> dict:
    """{"passed": n, ...} from pytest's closing line in ``text``."""
    import re

    return {k: int(v) for v, k in re.findall(r"(\d+) (passed|failed|skipped|error)", text)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "gpu_check")
    ap.add_argument("--budget", type=float, default=None, help="seconds (default 440, smoke 400)")
    ap.add_argument("--step-limit", type=float, default=150.0, help="seconds per measurement")
    ap.add_argument("--carry", type=Path, default=HERE / "carry")
    ap.add_argument("--smoke", action="store_true", help="every step at tiny sizes, on the CPU")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    budget = args.budget or (400.0 if args.smoke else 440.0)  # within 8 minutes in all
    runner = Runner(args.out, budget, args.carry, args.step_limit)
    if args.smoke:
        runner.env.update(JAX_PLATFORMS="cpu", DISTPM_TEST_PLATFORM="cpu")
    runner.write({"step": "start", "smoke": args.smoke, "budget_s": budget, "time": time.time()})
    for kind, options, env_extra in plan_of(args.smoke):
        runner.measure(kind, options, env_extra)
    runner.write({"step": "end", "left_s": runner.left()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
