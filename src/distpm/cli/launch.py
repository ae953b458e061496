"""``distpm launch``: run N distpm processes on this machine, joined through JAX's runtime.

For workstations and tests: every process gets the coordinator address
(127.0.0.1 and a free port), the process count and its id in ``DISTPM_*``
variables (see :mod:`distpm.parallel.runtime`), and its devices: on CPU its
own number of XLA devices (``cpu_devices``), on a multi-GPU machine its own
``gpus`` GPUs (process r gets GPUs r*gpus ... r*gpus + gpus - 1). Without
either, every process sees every GPU of the machine. Output lines are
forwarded with a ``[rank]`` prefix (progress bars keep their carriage
returns). If a process fails, the others are stopped and the launch exits
with its status.
"""

from __future__ import annotations

import io
import os
import signal
import socket
import subprocess
import sys
import threading
import time

STOP_GRACE_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _forward(stream, rank: int, out) -> None:
    # lines end at \n or \r (kept, so progress bars redraw); bad bytes must not stop us
    lines = io.TextIOWrapper(stream, encoding="utf-8", errors="replace", newline="")
    for line in iter(lines.readline, ""):
        out.write(f"[{rank}] {line}")
        out.flush()


def worker_environment(
    rank: int, n: int, port: int, cpu_devices: int | None, gpus: int | None = None
) -> dict:
    """Environment of process ``rank`` of ``n``: runtime variables and its devices."""
    env = dict(os.environ)
    env.update(
        DISTPM_COORDINATOR=f"127.0.0.1:{port}",
        DISTPM_NUM_PROCESSES=str(n),
        DISTPM_PROCESS_ID=str(rank),
        PYTHONUNBUFFERED="1",
    )
    if cpu_devices is not None:
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "device_count" not in f]
        flags.append(f"--xla_force_host_platform_device_count={cpu_devices}")
        env.update(XLA_FLAGS=" ".join(flags), JAX_PLATFORMS="cpu")
    if gpus is not None:
        env["DISTPM_LOCAL_DEVICE_IDS"] = ",".join(str(rank * gpus + i) for i in range(gpus))
    return env


def _stop(procs) -> None:
    """SIGTERM the processes still running; SIGKILL those that outlive the grace period."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + STOP_GRACE_S
    for p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def launch(
    n: int, command: list[str], cpu_devices: int | None = None, gpus: int | None = None
) -> int:
    """Run ``distpm <command>`` in ``n`` processes; return 0 or the first failure's status."""
    if n < 1:
        raise ValueError(f"-n must be positive, got {n}")
    if cpu_devices is not None and gpus is not None:
        raise ValueError("give --cpu-devices-per-process or --gpus-per-process, not both")
    for name, value in (("--cpu-devices-per-process", cpu_devices), ("--gpus-per-process", gpus)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if not command:
        raise ValueError("give the distpm command to run after --, e.g. -- run config.toml")
    port = free_port()
    procs, threads = [], []
    for rank in range(n):
        p = subprocess.Popen(
            [sys.executable, "-m", "distpm.cli.main", *command],
            env=worker_environment(rank, n, port, cpu_devices, gpus),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        procs.append(p)
        t = threading.Thread(target=_forward, args=(p.stdout, rank, sys.stdout), daemon=True)
        t.start()
        threads.append(t)
    status = 0
    try:
        while any(p.poll() is None for p in procs):
            failed = [p for p in procs if p.poll() not in (None, 0)]
            if failed:
                status = failed[0].returncode
                rank = procs.index(failed[0])
                message = f"distpm launch: process {rank} exited with {status}; stopping the others"
                print(message, file=sys.stderr, flush=True)
                break
            time.sleep(0.2)
    except KeyboardInterrupt:
        status = 130
    finally:
        _stop(procs)
        for t in threads:
            t.join(timeout=5)
    if status == 0:
        status = next((p.returncode for p in procs if p.returncode != 0), 0)
    return 128 - status if status < 0 else status  # killed by signal s: 128 + s, as shells do
