"""``distpm`` command line: argument parsing, errors as one line, then the pipeline."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


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
    run = sub.add_parser(
        "run", parents=[devices], help="run a simulation and write P(k), plots and a summary"
    )
    run.add_argument(
        "config",
        nargs="?",
        help="TOML file (default: SimConfig's defaults: 64^3 particles, 256 Mpc/h, "
        "2LPT from a=0.1, 10 steps to a=1)",
    )
    run.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config value, e.g. --set n_steps=20 --set cosmology.sigma8=0.9",
    )
    run.add_argument(
        "--devices",
        metavar="PXxPY",
        help="device grid, e.g. 2x2 (default: all devices, squarest grid that fits)",
    )
    procs = run.add_argument_group("many processes (default: detect srun / mpirun / distpm launch)")
    procs.add_argument("--coordinator", metavar="HOST:PORT", help="process 0's address")
    procs.add_argument("--num-processes", type=int, metavar="N")
    procs.add_argument("--process-id", type=int, metavar="I")
    procs.add_argument(
        "--cpu-collectives", choices=["gloo", "mpi"], help="CPU collectives (default gloo)"
    )
    run.add_argument("--out", default="distpm_out", help="output directory (default: distpm_out)")
    run.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    run.add_argument(
        "--save-fields",
        action="store_true",
        help="also write the final density (density.npy) and the white noise (white_noise.npy)",
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


def _run(args) -> None:
    from distpm.config import SimConfig, apply_overrides, read_toml

    values = read_toml(args.config) if args.config else {}
    values = apply_overrides(values, args.overrides)
    if args.devices:
        values["devices"] = args.devices
    power = values.get("linear_power")
    if args.config and isinstance(power, str) and not Path(power).is_absolute():
        relative = Path(args.config).parent / power  # files are relative to the config file
        if relative.is_file():
            values["linear_power"] = str(relative)
    cosmo_values = values.pop("cosmology", {})
    cfg = SimConfig.from_dict(values)
    if cfg.dtype == "float64":
        import jax

        jax.config.update("jax_enable_x64", True)  # the CLI owns its process
    from distpm.parallel import runtime
    from distpm.pipeline import cosmology_from_dict, run

    cosmo = cosmology_from_dict(cosmo_values)
    summary = run(cfg, cosmo, args.out, progress=not args.no_progress, save_fields=args.save_fields)
    t = summary["timings"]
    if not runtime.is_main_process():  # process 0 alone reports
        return
    print(
        f"done in {t['total_s']:.1f} s ({sum(t['steps_s']):.1f} s in {len(t['steps_s'])} steps); "
        f"wrote {', '.join(summary['outputs'])} to {args.out}"
    )


def _info() -> None:
    import jax

    import distpm

    print(f"distpm {distpm.__version__}, jax {jax.__version__}")
    print(f"backend: {jax.default_backend()}, {jax.device_count()} devices")
    print(f"process {jax.process_index()} of {jax.process_count()}")
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
    if args.command == "launch":
        from distpm.cli.launch import launch

        command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
        try:
            return launch(args.n, command, args.cpu_devices_per_process, args.gpus_per_process)
        except ValueError as err:
            print(f"distpm: error: {err}", file=sys.stderr)
            return 2
    from distpm.parallel.migrate import CapacityError  # imports jax, not its backends

    try:
        if args.cpu_devices is not None:
            from distpm.parallel.devices import set_cpu_device_count

            set_cpu_device_count(args.cpu_devices)
        _start_runtime(args)
        if args.command == "run":
            _run(args)
        else:
            _info()
    except (ValueError, TypeError, FloatingPointError, OSError, CapacityError) as err:
        print(f"distpm: error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
