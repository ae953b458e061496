"""A complete run: config -> initial conditions -> steps -> outputs on disk.

Used by ``distpm run``. The steps run one jitted kick-drift-kick at a time,
so the progress bar shows real per-step times; the physics is the same code
as :func:`distpm.simulate` (no gradients are needed here).
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm.auto import tqdm

from distpm import boltzmann, preflight, simulation
from distpm.analysis.catalogue import halo_catalogue
from distpm.analysis.fof import fof
from distpm.analysis.power_steps import PowerSteps
from distpm.config import SimConfig
from distpm.cosmology import Cosmology
from distpm.ic import white_noise
from distpm.io import checkpoint, folder, gadget, partial
from distpm.lightcone.config import LightconeConfig
from distpm.lightcone.run import LightconeObserver
from distpm.nbody.schedule import Schedule
from distpm.outputs import write_halos, write_observed, write_outputs
from distpm.parallel import devices, runtime
from distpm.parallel.decomposition import Decomposition
from distpm.parallel.migrate import check as check_capacity
from distpm.parallel.overflow import CapacityError
from distpm.plan import DoesNotFit, check_fits, memory_per_device
from distpm.runfile import HalosConfig, OutputConfig
from distpm.simulation import initial_conditions, kick_in_place, step_in_place
from distpm.state import Particles
from distpm.version import __version__


def evolve_with_progress(
    cosmo, cfg, *, start=None, progress=True, info=None, observers=(), results=None
):
    """Yield (step, state, seconds, kicked) after the ICs (step 0) and after every step.

    start: (state, step, kicked) to continue from (a checkpoint) instead of
    the ICs; it is yielded first, with 0 seconds. Use each state before
    asking for the next item: the next step reuses its buffers
    (``step_in_place``), which deletes it. ``info``, a dict, receives the
    per-device memory of the compiled step. ``results``, a list, receives
    after the last step the results of the ``observers``
    (:class:`distpm.nbody.observer.Observer`, which see every step).

    kicked: the steps are merged (:mod:`distpm.nbody.schedule`), so between
    steps the state is not synchronised (FastPM's momenta are kicked ahead
    to the next step's midpoint, the 2LPT integrator's positions lie half a
    step behind); it is (``kicked`` False) at the start and after the steps
    that end at a stop (an output), as in :func:`distpm.evolve`.
    """
    sched = Schedule.of(cosmo, cfg)
    observers = tuple(observers)
    t0 = time.perf_counter()
    if start is None:
        noise = white_noise(cfg.seed, cfg)
        state = jax.block_until_ready(initial_conditions(noise, cosmo, cfg))
        del noise  # this frame lives through the run: the noise would stay on the devices
        first, kicked = 0, False
    else:
        state, first, kicked = start
    yield first, state, time.perf_counter() - t0, kicked
    kicks, factors = np.asarray(sched.kicks()), np.asarray(sched.factors)
    a_next = np.asarray(sched.a[1:], dtype=cfg.float_dtype)
    records = simulation.empty_records(observers, cfg)
    with_records = {"observers": observers, "records": records, "step": first}
    compiled = step_in_place.lower(state, kicks[0], a_next[0], cosmo, cfg=cfg, **with_records)
    compiled = compiled.compile()
    if sched.kicks_first:  # FastPM's first kick, or the 2LPT integrator's closing drift
        name, first_op = "kick", kick_in_place.lower(state, factors[0, 0], cosmo, cfg=cfg)
    else:
        closing = (state, sched.closing_drift(0), cosmo)
        with_records = {**with_records, "stop": first + 1}
        del with_records["step"]
        first_op = simulation.drift_in_place.lower(*closing, cfg=cfg, **with_records)
        name = "drift"
    first_op = first_op.compile()
    if info is not None:
        info["step_memory_per_device"] = memory_per_device(compiled)
        info[f"{name}_memory_per_device"] = memory_per_device(first_op)
    show = progress and runtime.is_main_process()
    bar = tqdm(total=sched.n_steps, initial=first, unit="step", disable=not show, desc="PM steps")
    for i in range(first, sched.n_steps):
        t0 = time.perf_counter()
        if not kicked and sched.kicks_first:  # FastPM's K1, with the force at the positions
            state, needs = jax.block_until_ready(first_op(state, factors[i, 0], cosmo))
            check_capacity(needs, cfg)
        args = (state, kicks[i], a_next[i], cosmo)
        state, records, needs = compiled(*args, observers=observers, records=records, step=i)
        check_capacity(jax.block_until_ready(needs), cfg)
        kicked = not sched.synchronised_after(i)
        if not kicked and not sched.kicks_first:  # the 2LPT integrator's closing half drift
            closing = (state, sched.closing_drift(i), cosmo)
            observed = {"observers": observers, "records": records, "stop": i + 1}
            state, records, needs = first_op(*closing, **observed)
            check_capacity(jax.block_until_ready(needs), cfg)
        if i + 1 == sched.n_steps and results is not None:
            results.extend(simulation.finish(observers, records, state, cosmo, cfg))
        seconds = time.perf_counter() - t0
        bar.set_postfix(a=f"{sched.a[i + 1]:.3f}", step_s=f"{seconds:.2f}")
        bar.update()
        yield i + 1, state, seconds, kicked
    bar.close()


def _peak_memory(cfg) -> list | None:
    """Peak bytes in use per local device where the backend reports it (GPUs), else None."""
    used = set(jax.devices()[: Decomposition.of(cfg).n_devices])
    stats = [d.memory_stats() for d in jax.local_devices() if d in used]
    if any(s is None or "peak_bytes_in_use" not in s for s in stats):
        return None
    return [int(s["peak_bytes_in_use"]) for s in stats]


def _read_ics(path, cosmo, cfg) -> Particles:
    """Particles from Gadget IC files at ``cfg.a_start`` (checked by
    :func:`distpm.preflight.check_ics`)."""
    state = gadget.read_snapshot(path, cfg)
    return state.replace(a=jnp.asarray(cfg.a_start, state.pos.dtype))


class _CheckpointClock:
    """When to checkpoint: every ``checkpoint_every`` steps and/or after
    ``checkpoint_minutes`` of wall time (process 0's clock decides for all)."""

    def __init__(self, output: OutputConfig, last_step: int):
        self.every, self.seconds = output.checkpoint_every, 60.0 * output.checkpoint_minutes
        self.last_step, self.since = last_step, time.monotonic()

    def due(self, step: int) -> bool:
        if step >= self.last_step:  # the run ends here: nothing left to resume
            return False
        due = bool(self.every) and step % self.every == 0
        if self.seconds:
            late = time.monotonic() - self.since >= self.seconds
            due = due or runtime.agree(late)
        if due:
            self.since = time.monotonic()
        return due


def run_observers(cosmo, cfg, output: OutputConfig, lightcone) -> list:
    """The observers a run's steps carry: with a lightcone, its maps and P(k) after every
    step (for their Limber curves); P(k) every ``output.power_every`` steps."""
    observers = []
    if lightcone is not None:
        observers += [LightconeObserver.of(cosmo, cfg, lightcone), PowerSteps(cfg, 1)]
    if output.power_every:
        observers.append(PowerSteps(cfg, int(output.power_every)))
    return observers


HALO_BUFFERS = ("ghost_factor", "group_factor")  # the [halos] options that size the buffers


def _as_run_file_options(err, table: str, options) -> str:
    """An overflow's message with its options named as a run file names them (``table.x``)."""
    text = str(err)
    for name in options:
        text = text.replace(name, f"{table}.{name}")
    return text


RETRIES = 3  # the halo finder's tries with larger buffers after an overflow


def find_halos(state, cosmo, cfg, halos: HalosConfig, fits=lambda halos: None):
    """FoF halos (:func:`distpm.fof`) and their catalogue: (labels, catalogue, the
    :class:`HalosConfig` whose buffers held them, seconds).

    What the buffers need depends on how the final particles cluster, known only now: one
    too small is raised to the least value that holds what it needed and the halos are
    found again, at most ``RETRIES`` times, each once ``fits(halos)`` (the run's plan with
    those buffers; it raises where they do not fit the devices) allows. A run thus does not
    lose its halos to a buffer after its steps; the summary says which values held them.
    """
    t0 = time.perf_counter()
    for attempt in range(RETRIES + 1):
        try:
            labels = fof(state, cfg, **dataclasses.asdict(halos.fof_options()))
            cat = halo_catalogue(state, labels, cosmo, cfg, group_factor=halos.group_factor)
            return labels, cat, halos, time.perf_counter() - t0
        except CapacityError as err:
            if attempt == RETRIES or not err.least or set(err.least) - set(HALO_BUFFERS):
                raise
            halos = dataclasses.replace(halos, **err.least)
            fits(halos)


def run(
    cfg: SimConfig,
    cosmo: Cosmology,
    out_dir,
    *,
    output: OutputConfig | None = None,
    halos: HalosConfig | None = None,
    lightcone: LightconeConfig | None = None,
    resume=None,
    fallback=False,
    ics=None,
    progress=True,
    save_fields=False,
    device_memory=None,
    overwrite=False,
) -> dict:
    """Run a simulation and write power spectra, plots, snapshots and a summary to ``out_dir``.

    With several processes all of them compute; process 0 alone writes the
    spectra, plots and summary, and every process writes its own snapshot and
    checkpoint files. output: snapshots and checkpoints (:class:`OutputConfig`).
    halos: FoF halos of the final snapshot (:class:`HalosConfig`): a catalogue
    (``halos.npz``, ``halos.txt``), ``mass_function.png``, the largest
    halos circled on the final density image, and with Gadget-4 snapshots
    the final one in group order with its Gadget-4 catalogue
    (:func:`distpm.io.write_groups`).
    lightcone: the observer's past lightcone (:class:`distpm.lightcone.LightconeConfig`),
    recorded in every step: convergence maps, their C_ell against Limber
    predictions from the linear P(k) and from the P(k) measured after every
    step, and images (:mod:`distpm.lightcone.output`, in ``lightcone/``).
    resume: a run's output directory or a checkpoint in it: continue from its
    newest checkpoint, verified first (the config must have the same physics,
    outputs and halos). fallback: if that checkpoint is damaged, continue from
    the newest one that verifies instead of refusing
    (:func:`distpm.io.checkpoint.choose`).
    ics: a Gadget HDF5 snapshot (its directory or base path) at ``a_start``
    to start from instead of the config's white noise (see
    :func:`distpm.io.read_snapshot`).
    save_fields: also write the final density contrast (``density.npy``,
    the mesh, float) and the white noise (``white_noise.npy``, the particle
    grid), gathered from all devices. device_memory: [bytes] per device to plan
    against (:func:`distpm.plan.check_fits`; default what a GPU reports, nothing on
    CPUs): the run is refused before anything is allocated if its programs need more.
    overwrite: replace another run's outputs in ``out_dir`` instead of refusing them
    (:class:`distpm.io.folder.Claim`, which also locks the folder and marks it
    ``INCOMPLETE`` until the summary is written).
    Returns the summary (also written as ``summary.json``).
    """
    output = output or OutputConfig()
    halos = halos or HalosConfig()
    preflight.check_run(cfg, cosmo, output, halos, lightcone, resume, ics)
    same = (cfg, cosmo, output, halos, lightcone, str(out_dir), str(resume), str(ics), save_fields)
    same = repr(same)
    runtime.check_same_everywhere(same, "config")
    if resume is not None:  # verified before anything is compiled or allocated
        resume = checkpoint.resumable(resume, cfg, cosmo, output, halos, fallback)
    observers = run_observers(cosmo, cfg, output, lightcone)
    plan = check_fits(cosmo, cfg, device_memory, halos, observers)  # before the run's arrays
    out = Path(out_dir)
    resuming = resume is not None and checkpoint.run_directory(resume).resolve() == out.resolve()
    inputs = [cfg.linear_power] if Path(cfg.linear_power).is_file() else []  # never outputs
    claim = folder.Claim(out, resuming=resuming, overwrite=overwrite, inputs=inputs)
    try:
        preflight.check_space(out, cfg, output)
        summary = _run_claimed(
            out, cfg, cosmo, output, halos, lightcone, resume, ics, progress, save_fields,
            observers, plan, lambda h: check_fits(cosmo, cfg, device_memory, h, observers),
        )  # fmt: skip
    except BaseException:
        claim.release(complete=False)
        raise
    claim.release()
    return summary


def _run_claimed(
    out,
    cfg,
    cosmo,
    output,
    halos,
    lightcone,
    resume,
    ics,
    progress,
    save_fields,
    observers,
    plan,
    fits,
) -> dict:
    """:func:`run` once its output folder is claimed; ``fits(halos)`` plans it with other
    halo buffers (:func:`find_halos`)."""
    dec = Decomposition.of(cfg)
    timings = {"steps_s": []}
    t_start = time.perf_counter()
    info = {}
    start = None if resume is None else checkpoint.read_checkpoint(resume, cosmo, cfg)
    if ics is not None:
        start = _read_ics(ics, cosmo, cfg), 0, False
    observed = []
    runs = evolve_with_progress(
        cosmo, cfg, start=start, progress=progress, info=info, observers=observers, results=observed
    )
    first, _, timings["initial_conditions_s"], _ = next(runs)
    outputs = list(Schedule.stops_of(cfg))
    last = outputs[-1]
    clock = _CheckpointClock(output, last)
    written, checkpoints, halo_summary = [], [], None
    for step, state, seconds, kicked in runs:
        timings["steps_s"].append(seconds)
        if step in outputs:
            number = outputs.index(step)
            found, failed = None, None
            if step == last and halos.enabled:
                try:
                    *found, held, timings["halos_s"] = find_halos(state, cosmo, cfg, halos, fits)
                    raised = {
                        k: getattr(held, k) for k in HALO_BUFFERS
                        if getattr(held, k) != getattr(halos, k)
                    }  # fmt: skip
                except (CapacityError, DoesNotFit) as err:  # the steps' outputs are kept
                    found, failed = None, _as_run_file_options(err, "halos", HALO_BUFFERS)
            if found is not None:
                cat = found[1]
                halo_summary = {"groups": len(cat), "largest_members": int(cat.n[:1].sum())}
                halo_summary["raised"] = raised  # the buffers raised after an overflow
                if runtime.is_main_process():
                    written += write_halos(out, cat, cosmo, cfg, halos)
            written += write_outputs(
                out, state, number, step == last, cosmo, cfg, output, save_fields, found
            )
            if failed is not None:
                raise CapacityError(
                    f"the halo finder failed after the steps: {failed}; the run's other outputs "
                    f"are in {out} ({', '.join(written)}), marked INCOMPLETE"
                )
        if clock.due(step):
            t0 = time.perf_counter()
            checkpoint.write_checkpoint(out, state, step, cosmo, cfg, output, kicked, halos)
            checkpoints.append({"step": step, "seconds": time.perf_counter() - t0})
    t0 = time.perf_counter()
    written += write_observed(out, observers, observed, cosmo, cfg, lightcone)
    timings["observer_outputs_s"] = time.perf_counter() - t0
    timings["total_s"] = time.perf_counter() - t_start
    if checkpoints:
        written.append(checkpoint.DIRECTORY)
    summary = {
        "config": cfg.to_dict(),
        "output": dataclasses.asdict(output),
        "halos": {**dataclasses.asdict(halos), **(halo_summary or {})},
        "lightcone": None if lightcone is None else dataclasses.asdict(lightcone),
        "cosmology": {f.name: float(getattr(cosmo, f.name)) for f in dataclasses.fields(cosmo)},
        "resumed_from_step": None if start is None else first,
        "timings": timings,
        "checkpoints": checkpoints,
        "outputs": written + ["summary.json"],
        "device_grid": list(dec.grid),
        "devices": [str(d) for d in jax.devices()[: dec.n_devices]],
        "processes": jax.process_count(),
        "platform": jax.default_backend(),
        "deterministic": devices.is_deterministic(),
        "particle_capacity_per_device": dec.capacity,
        "memory_per_device": {**info, "peak_bytes_in_use": _peak_memory(cfg)},
        "memory_plan": plan,
        "versions": {
            "distpm": __version__,
            "jax": jax.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
            **({"camb": boltzmann.version()} if cfg.linear_power == "camb" else {}),
        },
    }
    if runtime.is_main_process():
        with partial.writing(out / "summary.json") as temporary:  # the last, the run complete
            temporary.write_text(json.dumps(summary, indent=2))
    runtime.barrier("distpm run: outputs written")
    return summary


def write_ics(cfg: SimConfig, cosmo: Cosmology, out_dir) -> Path:
    """Write the 2LPT particles at ``a_start`` as Gadget-4 initial conditions (float64).

    Files ``out_dir/ics/ics.{rank}.hdf5`` (Gadget-4: ``InitCondFile ics/ics``,
    ``ICFormat 3``); the same seed gives the same particles on any device
    grid or process count. Returns the base path.
    """
    cfg.check_runnable()
    runtime.check_same_everywhere(repr((cfg, cosmo, str(out_dir))), "config")
    state = initial_conditions(white_noise(cfg.seed, cfg), cosmo, cfg)
    state = jax.block_until_ready(state)
    return gadget.write_snapshot(
        Path(out_dir) / "ics", state, cosmo, cfg, number=None, base="ics", double=True
    )
