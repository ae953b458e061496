"""``distpm`` command line: argument parsing, errors as one line, then the pipeline."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

DEFAULT_CACHE = "~/.cache/distpm/xla"
INTERRUPTED = "distpm: interrupted; --resume OUT goes on from the newest checkpoint, if any"


def _leave_at_once_on_ctrl_c() -> None:
    """Ctrl-C ends the program at once, with one line and exit status 130.

    Python turns SIGINT into KeyboardInterrupt only when the main thread runs Python again,
    and it does not while it waits for a program on the devices: a 2048^3 step, or a
    collective whose peer is gone, would hold Ctrl-C off for minutes or for ever. The
    signal's C handler writes to a wakeup pipe at once, and a thread waiting on that pipe
    leaves. Nothing is left half-read: a checkpoint is trusted only with its manifest, every
    output is written under a temporary name, the folder stays marked INCOMPLETE, and its
    lock goes with the process."""
    import signal
    import threading

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:  # started so (nohup, a batch job)
        return
    wake, woken = os.pipe()
    os.set_blocking(woken, False)
    signal.set_wakeup_fd(woken, warn_on_full_buffer=False)
    signal.signal(signal.SIGINT, lambda *_: None)  # the thread below answers instead

    def leave() -> None:
        while signal.SIGINT not in os.read(wake, 64):
            pass
        sys.stdout.flush()  # what was printed, as a normal exit would
        os.write(2, (INTERRUPTED + "\n").encode())
        os._exit(130)  # before XLA's threads, maybe mid-step, are torn down under them

    threading.Thread(target=leave, name="ctrl-c", daemon=True).start()


def _use_compile_cache(value, environ=None) -> Path | None:
    """Turn on JAX's persistent compilation cache in the directory ``value``, else
    $DISTPM_COMPILE_CACHE, else $XDG_CACHE_HOME/distpm/xla, else DEFAULT_CACHE;
    'off' leaves it off. Returns the directory used, or None."""
    import os

    environ = os.environ if environ is None else environ
    value = value or environ.get("DISTPM_COMPILE_CACHE")
    if value is None:
        base = environ.get("XDG_CACHE_HOME")
        value = str(Path(base) / "distpm" / "xla") if base else DEFAULT_CACHE
    if value.strip().lower() in ("off", "none", "no", "0", ""):
        return None
    import jax

    directory = Path(value).expanduser()
    jax.config.update("jax_compilation_cache_dir", str(directory))
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)  # every program
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    return directory


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="distpm", description="Distributed differentiable PM simulations."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    devices = argparse.ArgumentParser(add_help=False)
    devices.add_argument(
        "--cpu-devices",
        type=int,
        metavar="N",
        help="split the CPU into N XLA devices (sets XLA_FLAGS before JAX starts)",
    )
    devices.add_argument(
        "--deterministic",
        action="store_true",
        help="bitwise repeatable results on GPUs (XLA's determinism flags; slower there; "
        "CPU results are repeatable already). Also DISTPM_DETERMINISTIC=1",
    )
    config = argparse.ArgumentParser(add_help=False)
    config.add_argument(
        "config",
        nargs="?",
        help="TOML file (default: SimConfig's defaults: 64^3 particles, 256 Mpc/h, "
        "2LPT from a=0.1, 10 steps to a=1)",
    )
    config.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set n_steps=20 --set cosmology.sigma8=0.9 "
        "--set output.checkpoint_every=5",
    )
    config.add_argument(
        "--devices",
        metavar="PXxPY",
        help="device grid, e.g. 2x2 (default: all devices, squarest grid that fits)",
    )
    procs = config.add_argument_group(
        "many processes (default: detect srun / mpirun / distpm launch)"
    )
    procs.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address")
    procs.add_argument("--num-processes", type=int, metavar="N")
    procs.add_argument("--process-id", type=int, metavar="I")
    procs.add_argument(
        "--cpu-collectives", choices=["gloo", "mpi"], help="CPU collectives (default gloo)"
    )
    config.add_argument(
        "--out", help="output directory (default: distpm_out; plan: writes plan.txt, plan.json)"
    )
    config.add_argument(
        "--compile-cache",
        metavar="DIR",
        help="JAX's persistent compilation cache, so a repeated run does not compile again "
        f"(default: $DISTPM_COMPILE_CACHE, else {DEFAULT_CACHE}; 'off' to disable)",
    )
    run = sub.add_parser(
        "run",
        parents=[devices, config],
        help="run a simulation and write P(k), plots, snapshots and a summary",
    )
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument(
        "--save-fields",
        action="store_true",
        help="also write the final density (density.npy) and the white noise (white_noise.npy)",
    )
    run.add_argument(
        "--resume",
        metavar="DIR",
        help="continue from the newest checkpoint in DIR (a run's output directory); "
        "without a config file, the checkpoint's own config is used",
    )
    run.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the outputs of another run in --out (refused without it)",
    )
    run.add_argument(
        "--fallback",
        action="store_true",
        help="with --resume: if the newest checkpoint is damaged, resume from the newest one "
        "that verifies (and say which) instead of refusing",
    )
    run.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="memory of one device, e.g. 80GB or 16GiB (default: what a GPU reports); "
        "the run is planned first (distpm plan) and refused if it does not fit",
    )
    run.add_argument(
        "--ics",
        metavar="PATH",
        help="start from these Gadget HDF5 initial conditions (e.g. from `distpm ics`) "
        "instead of the config's white noise; their Time must equal a_start",
    )
    sub.add_parser(
        "ics",
        parents=[devices, config],
        help="write the 2LPT initial conditions as Gadget-4 HDF5 files (OUT/ics/ics.N.hdf5)",
    )
    plan = sub.add_parser(
        "plan",
        parents=[devices, config],
        help="compile a run's programs without running them and print the memory per device",
    )
    plan.add_argument(
        "--device-memory",
        metavar="SIZE",
        help="memory of one device, e.g. 80GB or 16GiB (default: what a GPU reports); "
        "exit status 1 if the run does not fit",
    )
    plan.add_argument(
        "--target",
        choices=("h100", "h200", "a100"),  # targets.NAMES (not imported: it would start jax)
        help="compile for this GPU on the run's device grid, with no GPU present (XLA's GPU "
        'compiler: pip install ".[gpu]"), and compare with its allocator\'s share of the '
        "card (75%%, or XLA_PYTHON_CLIENT_MEM_FRACTION); needs --devices",
    )
    plan.add_argument(
        "--gradient",
        action="store_true",
        help="also plan the gradient of a loss on the final density w.r.t. the white noise",
    )
    sub.add_parser("info", parents=[devices], help="show the JAX backend and devices")
    launch = sub.add_parser(
        "launch",
        help="run a distpm command in N local processes joined by JAX's runtime",
        usage="distpm launch -n N [--cpu-devices-per-process M | --gpus-per-process G] "
        "-- run CONFIG ...",
    )
    launch.add_argument("-n", type=int, required=True, help="number of processes")
    launch.add_argument(
        "--cpu-devices-per-process", type=int, metavar="M", help="XLA CPU devices per process"
    )
    launch.add_argument(
        "--gpus-per-process",
        type=int,
        metavar="G",
        help="GPUs per process on a multi-GPU machine (default: every process sees every "
        "GPU; ignored on CPU)",
    )
    launch.add_argument("command_args", nargs=argparse.REMAINDER, help="-- then the distpm command")
    return parser


def _settings(args):
    """(SimConfig, Cosmology, OutputConfig, HalosConfig, LightconeConfig or None) from the
    config file (or a resumed run's checkpoint), ``--set`` and ``--devices``."""
    from distpm.runfile import apply_overrides, read_toml, settings

    resume = getattr(args, "resume", None)
    if args.config:
        values = read_toml(args.config)
    elif resume:
        from distpm.io import checkpoint

        values = checkpoint.stored_settings(resume, getattr(args, "fallback", False))
    else:
        values = {}
    overrides = [*args.overrides, *([f"parallel.devices={args.devices}"] if args.devices else [])]
    values = apply_overrides(values, overrides)
    cfg, cosmo, output, halos, lightcone = settings(
        values, Path(args.config).parent if args.config else None
    )
    if cfg.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)  # the CLI owns its process
    return cfg, cosmo, output, halos, lightcone


def _run(args) -> None:
    from distpm import plan
    from distpm.parallel import runtime
    from distpm.pipeline import run

    if args.fallback and not args.resume:
        raise ValueError("--fallback chooses the checkpoint to --resume from; give --resume DIR")
    if args.out is not None and not args.out.strip():
        raise ValueError("--out is empty: name the folder to write into")
    cfg, cosmo, output, halos, lightcone = _settings(args)
    out = args.out
    if out is None:
        from distpm.io import checkpoint

        out = checkpoint.run_directory(args.resume) if args.resume else "distpm_out"
    summary = run(
        cfg,
        cosmo,
        out,
        output=output,
        halos=halos,
        lightcone=lightcone,
        resume=args.resume,
        fallback=args.fallback,
        overwrite=args.overwrite,
        ics=args.ics,
        progress=not args.no_progress,
        save_fields=args.save_fields,
        device_memory=args.device_memory and plan.parse_bytes(args.device_memory),
    )
    t = summary["timings"]
    if not runtime.is_main_process():  # process 0 alone reports
        return
    raised = summary["halos"].get("raised")
    if raised:  # an overflow after the steps, found again with larger buffers
        values = ", ".join(f"halos.{k} = {v}" for k, v in raised.items())
        print(f"halos found with {values}: the run file's were too small for these particles")
    resumed = summary["resumed_from_step"]
    resumed = "" if resumed is None else f" (resumed after step {resumed})"
    print(
        f"done in {t['total_s']:.1f} s ({sum(t['steps_s']):.1f} s in {len(t['steps_s'])} "
        f"steps{resumed}); wrote {', '.join(summary['outputs'])} to {out}"
    )


def _ics(args) -> None:
    from distpm.parallel import runtime
    from distpm.pipeline import write_ics

    cfg, cosmo, *_ = _settings(args)
    base = write_ics(cfg, cosmo, args.out or "distpm_out")
    if runtime.is_main_process():
        print(f"wrote {cfg.n_particles} particles at a={cfg.a_start} to {base}.*.hdf5")


def _plan(args) -> int:
    from distpm import plan
    from distpm.io import partial
    from distpm.parallel import targets
    from distpm.pipeline import run_observers

    cfg, cosmo, output, halos, lightcone = _settings(args)
    if args.device_memory:
        memory = plan.parse_bytes(args.device_memory)
    elif args.target:  # the allocator's share of the card
        memory = targets.budget_bytes(args.target)
    else:
        memory = plan.device_memory()
    observers = run_observers(cosmo, cfg, output, lightcone)
    result = plan.memory_plan(
        cosmo, cfg, gradient=args.gradient, halos=halos, observers=observers, target=args.target
    )
    lines = plan.describe(result, cfg, memory)
    print("\n".join(lines))
    if args.out:  # the plan as printed, and its numbers
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        partial.write_text(out / "plan.txt", "\n".join(lines) + "\n")
        numbers = json.dumps(
            result, indent=1, default=lambda x: x.item() if hasattr(x, "item") else str(x)
        )
        partial.write_text(out / "plan.json", numbers)
    return 1 if memory is not None and result["peak_bytes"] > memory else 0


def _info() -> None:
    import jax

    import distpm

    print(f"distpm {distpm.__version__}, jax {jax.__version__}")
    print(f"backend: {jax.default_backend()}, {jax.device_count()} devices")
    print(f"process {jax.process_index()} of {jax.process_count()}")
    from distpm.parallel.devices import is_deterministic

    print(f"deterministic: {'yes' if is_deterministic() else 'no (distpm --deterministic)'}")
    for d in jax.devices():
        print(f"  {d}")


def _start_runtime(args) -> None:
    """Join the other processes if this is one of several (see distpm.parallel.runtime)."""
    from distpm.parallel import runtime

    settings = runtime.settings_from_env(
        coordinator=getattr(args, "coordinator", None),
        num_processes=getattr(args, "num_processes", None),
        process_id=getattr(args, "process_id", None),
        cpu_collectives=getattr(args, "cpu_collectives", None),
    )
    if runtime.needed(settings):
        runtime.initialize(settings)


def main(argv=None) -> int:
    args = _parser().parse_args(argv)
    if argv is None:  # the program itself: a full disk is one line, not h5py's many
        from distpm.io.partial import quiet_unwritable

        sys.unraisablehook = quiet_unwritable
    if args.command == "launch":
        from distpm.cli.launch import launch

        command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
        try:
            return launch(args.n, command, args.cpu_devices_per_process, args.gpus_per_process)
        except ValueError as err:
            print(f"distpm: error: {err}", file=sys.stderr)
            return 2
    if argv is None:  # the launcher above stops its processes on Ctrl-C; each leaves at once
        _leave_at_once_on_ctrl_c()
    from distpm.parallel.overflow import CapacityError  # imports jax, not its backends
    from distpm.parallel.targets import NoGpuCompiler, prepare_environment

    try:
        if getattr(args, "target", None):
            prepare_environment()
        if args.cpu_devices is not None:
            from distpm.parallel.devices import set_cpu_device_count

            set_cpu_device_count(args.cpu_devices)
        if args.deterministic:
            from distpm.parallel.devices import set_deterministic

            set_deterministic()
        _start_runtime(args)
        if args.command in ("run", "ics", "plan"):
            _use_compile_cache(args.compile_cache)
        if args.command == "run":
            _run(args)
        elif args.command == "ics":
            _ics(args)
        elif args.command == "plan":
            return _plan(args)
        else:
            _info()
    except (
        ValueError, TypeError, FloatingPointError, OSError, CapacityError, NoGpuCompiler
    ) as err:  # fmt: skip
        print(f"distpm: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # main() called from Python; the program leaves at once instead
        print(INTERRUPTED, file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
