"""What a run will need per device, from its compiled programs, before it runs.

:func:`memory_plan` compiles (ahead of time, from shapes and shardings
only: nothing the size of the run is allocated) the programs a run is made
of, for ``cfg``'s device grid, and reads XLA's memory analysis of each:

- ``initial_conditions``: white noise to LPT particles;
- ``kick`` (FastPM): a force and a kick with the state's buffers reused
  (:data:`distpm.simulation.kick_in_place`: ``distpm run`` kicks the
  particles so at the start and after each output), or ``drift`` (the 2LPT
  integrator): the half drift that synchronises the state at each output, with
  what the observers record in it (:data:`distpm.simulation.drift_in_place`);
- ``step``: one step (drift, force, merged kick) with the state's buffers
  reused (:data:`distpm.simulation.step_in_place`, as ``distpm run`` steps),
  with what the run's observers record at it (the lightcone, P(k) every N
  steps);
- ``output_density`` and ``output_power``: an output's density from the
  particles, then its P(k), each with all of the particles counted (the run
  holds them meanwhile);
- ``gradient`` (optional): the gradient of a field-level loss,
  sum(delta^2) of the final density, with respect to the white noise,
  through the whole run and its reverse-time adjoint;
- ``fof`` and ``catalogue`` (when ``[halos]`` is on): friends-of-friends on
  the final particles, and the catalogue of its groups with every slot
  labelled (the catalogue compacts the labelled particles into the fewest
  slots that hold them: the plan takes the most);
- ``overdensity`` (with ``[halos]``): the catalogue's spherical-overdensity search,
  for as many centres per device as the catalogue has records and search radii up to
  :data:`distpm.analysis.overdensity.PLANNED_RADIUS` (larger ones widen its ghosts).

A device needs at least the largest of them. The figures are XLA's for the
backend the programs are compiled for: this runtime's devices, or with
``target`` (``distpm plan --target h100``) a GPU's, compiled by XLA's GPU
compiler on a machine without one (:mod:`distpm.parallel.targets`). The CPU's
figures are only an estimate of a GPU's: GPU programs fuse and schedule
differently. Each program's HLO is also read (:func:`distpm.compiled.summary`)
for what a GPU would wait on the host for.

On a GPU two things lie outside XLA's memory analysis, and the plan counts
them: the FFT library's work area (cuFFT allocates it beside XLA's buffers
for each transform; a batched 1-D transform of the local pencil needs up to
one complex field of it), and the allocator's limit, which is not the card's
memory: JAX lets XLA use 75% of it by default
(``XLA_PYTHON_CLIENT_MEM_FRACTION=0.95`` raises it to 95%).
"""

from __future__ import annotations

import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from distpm import compiled as compiled_hlo
from distpm import simulation
from distpm.analysis import catalogue, fof, overdensity, power
from distpm.nbody.schedule import Schedule
from distpm.parallel import devices, targets
from distpm.parallel.decomposition import SLOTS, Decomposition
from distpm.state import Particles

BYTES = {"k": 1e3, "m": 1e6, "g": 1e9, "t": 1e12, "ki": 2**10, "mi": 2**20, "gi": 2**30}


def parse_bytes(text) -> float:
    """Bytes from ``80GB``, ``80 GiB``, ``512MiB`` or a plain number."""
    value = str(text).strip().lower().replace(" ", "").removesuffix("b")
    unit = value.lstrip("0123456789.e+")
    number = value[: len(value) - len(unit)] if unit else value
    try:
        if unit and unit not in BYTES:
            raise ValueError
        return float(number) * BYTES.get(unit, 1.0)
    except ValueError:
        raise ValueError(f"device memory must look like 80GB or 16GiB, got {text!r}") from None


def abstract_state(cfg) -> Particles:
    """The shapes, dtypes and shardings of a run's particles (no data)."""
    dec = Decomposition.of(cfg)
    sharding = dec.sharding(SLOTS)
    slots, dtype = dec.slots, cfg.float_dtype

    def array(shape, kind):
        return jax.ShapeDtypeStruct(shape, kind, sharding=sharding)

    return Particles(
        pos=array((slots, 3), dtype),
        vel=array((slots, 3), dtype),
        ids=array((slots, 2), np.int32),
        mask=array((slots,), np.bool_),
        a=jax.ShapeDtypeStruct((), dtype),
    )


def abstract_noise(cfg):
    """The shape, dtype and sharding of :func:`distpm.white_noise` (no data)."""
    return jax.ShapeDtypeStruct(
        cfg.particle_shape, cfg.float_dtype, sharding=Decomposition.of(cfg).sharding()
    )


def _loss(noise, cosmo, cfg):
    delta = simulation.density(simulation.simulate(noise, cosmo, cfg), cfg)
    return jnp.sum(delta * delta)


def _output_density(state, cfg):
    return simulation._density(state, cfg, migrate=False)


def _output_power(state, delta, cfg):
    return power._binned(delta, None, cfg, tuple(power.k_bin_edges(cfg)), True)


def _programs(cosmo, cfg, gradient: bool, halos=None, observers=()) -> dict:
    """{name: (jitted function, abstract arguments, keyword arguments)} of the programs to
    plan. halos: the run's ``[halos]`` (:class:`distpm.runfile.HalosConfig`); observers:
    what its steps carry (:func:`distpm.pipeline.run_observers`)."""
    sched = Schedule.of(cosmo, cfg)
    a_next = np.asarray(cfg.time_grid[1], cfg.float_dtype)
    state = abstract_state(cfg)
    static, dec = {"cfg": cfg}, Decomposition.of(cfg)
    observed = {}
    if observers:
        records = jax.eval_shape(lambda o: simulation.empty_records(o, cfg), tuple(observers))
        observed = {"observers": tuple(observers), "records": records, "step": 0}
    programs = {
        "initial_conditions": (
            simulation._initial_conditions,  # what a run compiles: its needs are checked after it
            (abstract_noise(cfg), cosmo),
            static,
        ),
        "step": (
            simulation.step_in_place,
            (state, sched.kicks()[0], a_next, cosmo),
            {**static, **observed},
        ),
    }
    if sched.kicks_first:  # FastPM's first kick, or the 2LPT integrator's closing drift
        programs["kick"] = (simulation.kick_in_place, (state, sched.factors[0, 0], cosmo), static)
    else:
        closing = {**static, **observed, "stop": 1} if observers else static
        closing.pop("step", None)
        drift = (state, sched.closing_drift(0), cosmo)
        programs["drift"] = (simulation.drift_in_place, drift, closing)
    # the run holds all of its particles while it makes an output's density, then its P(k):
    # keep_unused counts the arrays the programs do not read (jit would leave them out)
    held = functools.partial(jax.jit, static_argnames="cfg", keep_unused=True)
    field = Decomposition.of(cfg).sharding()
    delta = jax.ShapeDtypeStruct(cfg.mesh_shape, cfg.float_dtype, sharding=field)
    programs["output_density"] = (held(_output_density), (state,), static)
    programs["output_power"] = (held(_output_power), (state, delta), static)
    if gradient:
        grad = jax.jit(jax.grad(_loss), static_argnames="cfg")
        programs["gradient"] = (grad, (abstract_noise(cfg), cosmo), static)
    if halos is not None and halos.enabled:
        labels = jax.ShapeDtypeStruct(
            (state.mask.shape[0], 2), np.int32, sharding=state.mask.sharding
        )
        programs["fof"] = (fof._fof_particles, (state,), {**static, "opts": halos.fof_options()})
        size = catalogue.record_slots(cfg, halos.group_factor)
        programs["catalogue"] = (
            catalogue._catalogue, (state, labels), {**static, "size": size, "room": dec.capacity}
        )  # fmt: skip
        programs["overdensity"] = overdensity.planned(state, cfg, size)
    return programs


def memory_per_device(compiled) -> dict:
    """Bytes per device of a compiled sharded function (XLA's memory analysis)."""
    m = compiled.memory_analysis()
    names = ("argument", "output", "temp", "alias", "generated_code")
    out = {f"{n}_bytes": int(getattr(m, f"{n}_size_in_bytes")) for n in names}
    out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"]
    out["total_bytes"] -= out["alias_bytes"]
    return out


def fft_workspace_bytes(cfg, backend: str) -> int:
    """[bytes] per device of the FFT library's work area that XLA's memory analysis leaves
    out: none on the CPU (XLA's own FFT), one complex field of the local pencil on a GPU."""
    if backend == "cpu":
        return 0
    nx, ny, nz = cfg.mesh_shape
    px, py = Decomposition.of(cfg).grid
    complex_bytes = 2 * np.dtype(cfg.float_dtype).itemsize
    return (nx // px) * (ny // py) * (nz // 2 + 1) * complex_bytes


# the programs that make no FFT, and so need no FFT work area (the 2LPT integrator's closing
# drift makes one when it carries observers: P(k) every N steps)
WITHOUT_FFT = ("drift", "output_density", "fof", "catalogue", "overdensity")


def program_memory(compiled, seconds: float, cfg, ffts: bool = True, platform=None) -> dict:
    """:func:`memory_per_device` of one compiled program, with the FFT work area
    (:func:`fft_workspace_bytes`, counted in its total, if it makes ``ffts``), its bytes
    per particle (per device, over N / P), its compile seconds and what its program holds
    that a GPU reads on the host (:func:`distpm.compiled.summary`). platform: the one it
    was compiled for (default: this runtime's)."""
    memory, dec = memory_per_device(compiled), Decomposition.of(cfg)
    workspace = fft_workspace_bytes(cfg, platform or devices.platform()) if ffts else 0
    memory["fft_workspace_bytes"] = workspace
    memory["total_bytes"] += memory["fft_workspace_bytes"]
    memory["bytes_per_particle"] = memory["total_bytes"] / (cfg.n_particles / dec.n_devices)
    memory["compile_s"] = seconds
    memory.update(compiled_hlo.summary(compiled.as_text()))
    return memory


def compile_programs(
    cosmo, cfg, *, gradient: bool = False, halos=None, observers=(), target=None
) -> dict:
    """{name: (compiled program, compile seconds)} of the programs in the module doc, for
    this runtime's devices or, with ``target`` (a GPU of :data:`distpm.parallel.targets.NAMES`),
    for as many of that GPU as the device grid has: XLA's GPU compiler, no GPU needed."""
    cfg.check_runnable()
    if target is None:
        return _compile(cosmo, cfg, gradient, halos, observers)
    grid = cfg.parallel.devices
    if grid is None:
        raise ValueError("a plan for a GPU target needs the device grid: give --devices PXxPY")
    with devices.compiling_for(targets.devices(target, grid[0] * grid[1])):
        return _compile(cosmo, cfg, gradient, halos, observers)


def _compile(cosmo, cfg, gradient, halos, observers) -> dict:
    out = {}
    for name, (fn, args, kwargs) in _programs(cosmo, cfg, gradient, halos, observers).items():
        t0 = time.perf_counter()
        try:
            out[name] = fn.lower(*args, **kwargs).compile(), time.perf_counter() - t0
        except ValueError as err:  # a program that cannot be made at this size says which
            raise ValueError(f"the {name} program cannot be made: {err}") from err
        except OverflowError as err:  # an index past int32 (issue 59: not yet lifted)
            why = f"an int32 overflows ({str(err).splitlines()[0]})"
            raise ValueError(f"the {name} program cannot be made: {why}") from err
    return out


def memory_plan(
    cosmo, cfg, *, gradient: bool = False, halos=None, observers=(), target=None
) -> dict:
    """Per-device memory of the run's compiled programs (see the module doc).

    Returns {"programs": {name: {argument, output, temp, alias, total (bytes),
    bytes_per_particle, compile_s, and the counts of :func:`distpm.compiled.summary`}},
    "peak_bytes", "particles_per_device", "devices", "backend", "target"}; ``total`` =
    argument + output + temp - alias, and bytes per particle divide it by N / P.
    target: compile for that GPU (see :func:`compile_programs`); "target" then holds its
    name, the card's memory and the allocator's budget (``budget_bytes``).
    """
    programs = compile_programs(
        cosmo, cfg, gradient=gradient, halos=halos, observers=observers, target=target
    )
    dec, backend = Decomposition.of(cfg), "gpu" if target else devices.platform()
    without = set(WITHOUT_FFT) - ({"drift"} if observers else set())
    out = {
        name: program_memory(c, seconds, cfg, name not in without, backend)
        for name, (c, seconds) in programs.items()
    }
    card = None
    if target:
        card = {
            "name": target,
            "card": targets.description(target),
            "memory_bytes": targets.memory_bytes(target),
            "fraction": targets.memory_fraction(),
        }
        card["budget_bytes"] = targets.budget_bytes(target)
    return {
        "programs": out,
        "peak_bytes": max(m["total_bytes"] for m in out.values()),
        "particles_per_device": cfg.n_particles / dec.n_devices,
        "devices": list(dec.grid),
        "backend": backend,
        "target": card,
    }


def device_memory() -> float | None:
    """Bytes of memory of this process's first device, when the backend says (GPUs do)."""
    stats = getattr(jax.local_devices()[0], "memory_stats", lambda: None)()
    return float(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


class DoesNotFit(ValueError):
    """A run's programs need more memory per device than a device has."""


def check_fits(cosmo, cfg, memory: float | None = None, halos=None, observers=()) -> dict | None:
    """Plan the run (:func:`memory_plan`) and raise :class:`DoesNotFit`, with the lines
    ``distpm plan`` prints, when its largest program needs more than ``memory`` bytes
    per device. memory: default what the device reports (:func:`device_memory`: a
    GPU's allocator limit); where it reports nothing (XLA's CPU backend) and none is
    given, nothing is compiled or checked and None is returned. ``distpm run`` calls
    this before it allocates anything, so a run that cannot fit stops at once.
    """
    memory = device_memory() if memory is None else memory
    if memory is None:
        return None
    result = memory_plan(cosmo, cfg, halos=halos, observers=observers)
    if result["peak_bytes"] > memory:
        lines = describe(result, cfg, memory)
        raise DoesNotFit("the run does not fit its devices:\n" + "\n".join(lines))
    return result


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def describe(plan: dict, cfg, memory: float | None) -> list[str]:
    """The lines ``distpm plan`` prints. memory: the bytes a device may use (None: not
    compared); for a GPU target, default its allocator's budget."""
    dec, card = Decomposition.of(cfg), plan.get("target")
    (px, py), capacity = dec.grid, dec.capacity
    where = plan["backend"]
    if card:
        where = f"compiled for {px * py} x {card['card']}, not run on them"
        memory = card["budget_bytes"] if memory is None else memory
    lines = [
        f"{cfg.particle_shape[0]}^3 particles on a {px}x{py} grid ({where}): "
        f"{plan['particles_per_device']:.4g} particles and {capacity} slots per device",
        f"{'program':<20}{'per device':>12}{'bytes/particle':>16}{'of it temp.':>13}"
        f"{'compile':>9}{'host reads':>12}",
    ]
    for name, m in plan["programs"].items():
        reads = f"{m['host_callbacks']}/{m['data_dependent_loops']}/{m['conditionals']}"
        over = "  does NOT fit" if memory is not None and m["total_bytes"] > memory else ""
        lines.append(
            f"{name:<20}{_size(m['total_bytes']):>12}{m['bytes_per_particle']:>16.0f}"
            f"{_size(m['temp_bytes']):>13}{m['compile_s']:>8.1f}s{reads:>12}{over}"
        )
    lines.append(
        "(host reads: host callbacks / while loops whose trip count depends on data / "
        "conditionals; a GPU waits for the host at each)"
    )
    peak = plan["peak_bytes"]
    if memory is None:
        lines.append(f"needs {_size(peak)} per device (give --device-memory to compare)")
        return lines
    verdict = "fits" if peak <= memory else "does NOT fit"
    of = f"{_size(memory)}"
    if card and memory == card["budget_bytes"]:
        of = (
            f"the allocator's {of} ({100 * card['fraction']:.0f}% of the card's "
            f"{_size(card['memory_bytes'])})"
        )
    lines.append(f"needs {_size(peak)} per device of {of}: {verdict} ({100 * peak / memory:.0f}%)")
    if plan["backend"] != "cpu" and peak > memory:
        lines.append(
            f"(JAX lets XLA use {100 * targets.memory_fraction():.0f}% of a GPU's memory "
            f"(XLA_PYTHON_CLIENT_MEM_FRACTION): {targets.FRACTION_ENV}=0.95 raises that)"
        )
    return lines
