"""A complete run: config -> initial conditions -> steps -> outputs on disk.

Used by ``distpm run``. The steps run one jitted kick-drift-kick at a time,
so the progress bar shows real per-step times; the physics is the same code
as :func:`distpm.simulate` (no gradients are needed here).
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

import distpm
from distpm import integrate
from distpm.config import SimConfig
from distpm.cosmology import Cosmology
from distpm.parallel import runtime
from distpm.parallel.migrate import check as check_capacity
from distpm.simulation import initial_conditions, step_in_place, with_force
from distpm.state import Particles

COSMOLOGY_PRESETS = {"planck18": Cosmology.planck18, "planck15": Cosmology.planck15}


def cosmology_from_dict(values: dict) -> Cosmology:
    """Cosmology from a ``[cosmology]`` table: an optional ``preset`` plus overrides.

    ``Omega_m`` may be given instead of ``Omega_c`` (then Omega_c = Omega_m - Omega_b).
    """
    if not isinstance(values, dict):
        raise ValueError(f"cosmology must be a table of parameters, got {values!r}")
    values = dict(values)
    preset = values.pop("preset", "planck18")
    if preset not in COSMOLOGY_PRESETS:
        raise ValueError(
            f"unknown cosmology preset {preset!r}; use one of {sorted(COSMOLOGY_PRESETS)}"
        )
    known = {f.name for f in dataclasses.fields(Cosmology)}
    unknown = sorted(set(values) - known - {"Omega_m"})
    if unknown:
        raise ValueError(
            f"unknown cosmology parameter(s) {unknown}; "
            f"valid: {sorted(known | {'Omega_m', 'preset'})}"
        )
    try:
        values = {k: float(v) for k, v in values.items()}
    except (TypeError, ValueError):
        raise ValueError(f"cosmology parameters must be numbers, got {values}") from None
    base = COSMOLOGY_PRESETS[preset]()
    if "Omega_m" in values:
        if "Omega_c" in values:
            raise ValueError("give Omega_m or Omega_c, not both")
        values["Omega_c"] = values.pop("Omega_m") - values.get("Omega_b", base.Omega_b)
    cosmo = base.replace(**values)
    checks = {
        "Omega_c >= 0": cosmo.Omega_c >= 0,
        "Omega_b >= 0": cosmo.Omega_b >= 0,
        "0 < Omega_m <= 1": 0 < cosmo.Omega_m <= 1,
        "h > 0": cosmo.h > 0,
        "sigma8 > 0": cosmo.sigma8 > 0,
        "T_cmb > 0": cosmo.T_cmb > 0,
    }
    failed = [name for name, ok in checks.items() if not ok]
    if failed or not all(math.isfinite(float(v)) for v in dataclasses.astuple(cosmo)):
        raise ValueError(
            f"unphysical cosmology (need {', '.join(failed) or 'finite values'}): {cosmo}"
        )
    return cosmo


def _checked(result, cfg) -> Particles:
    state, needs = jax.block_until_ready(result)
    check_capacity(needs, cfg)
    return state


def memory_per_device(compiled) -> dict:
    """Bytes per device of a compiled sharded function (XLA's memory analysis)."""
    m = compiled.memory_analysis()
    names = ("argument", "output", "temp", "alias", "generated_code")
    out = {f"{n}_bytes": int(getattr(m, f"{n}_size_in_bytes")) for n in names}
    out["total_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"]
    out["total_bytes"] -= out["alias_bytes"]
    return out


def evolve_with_progress(cosmo, cfg, *, progress=True, info=None):
    """Yield (state or None, seconds, is_final) after the ICs and after every step.

    The first item holds the initial state; later items hold the state at the
    outputs (snapshots and a_stop) and None elsewhere. Use a state before
    asking for the next item: the next step reuses its buffers
    (``step_in_place``), which deletes it.
    ``info``, a dict, receives the per-device memory of the compiled step.
    """
    t0 = time.perf_counter()
    noise = distpm.white_noise(cfg.seed, cfg)
    state = _checked(with_force(initial_conditions(noise, cosmo, cfg), cosmo, cfg), cfg)
    yield state, time.perf_counter() - t0, False
    factors = integrate.step_factors(cosmo, cfg)
    grid = cfg.time_grid
    outputs = {stop for _, stop in integrate.segments(cfg)}
    a_next = np.asarray(grid[1:], dtype=cfg.float_dtype)
    compiled = step_in_place.lower(state, factors[0], a_next[0], cosmo, cfg=cfg).compile()
    if info is not None:
        info["step_memory_per_device"] = memory_per_device(compiled)
    show = progress and runtime.is_main_process()
    bar = tqdm(total=len(grid) - 1, unit="step", disable=not show, desc="PM steps")
    for i in range(len(grid) - 1):
        t0 = time.perf_counter()
        state = _checked(compiled(state, factors[i], a_next[i], cosmo), cfg)
        seconds = time.perf_counter() - t0
        bar.set_postfix(a=f"{grid[i + 1]:.3f}", step_s=f"{seconds:.2f}")
        bar.update()
        final = i + 1 == len(grid) - 1
        yield (state if i + 1 in outputs else None), seconds, final
    bar.close()


def check_finite(state: Particles):
    """Raise if the state holds NaN or inf (e.g. from a bad cosmology)."""
    for name in ("pos", "vel"):
        if not bool(jnp.all(jnp.isfinite(getattr(state, name)))):
            raise FloatingPointError(f"non-finite particle {name} at a={float(state.a):.4f}")


def _peak_memory(cfg) -> list | None:
    """Peak bytes in use per local device where the backend reports it (GPUs), else None."""
    used = set(jax.devices()[: cfg.n_devices])
    stats = [d.memory_stats() for d in jax.local_devices() if d in used]
    if any(s is None or "peak_bytes_in_use" not in s for s in stats):
        return None
    return [int(s["peak_bytes_in_use"]) for s in stats]


def write_power(path: Path, k, p, n_modes, p_lin):
    header = "k [h/Mpc]  P [(Mpc/h)^3]  n_modes  P_lin(a) [(Mpc/h)^3]"
    filled = np.asarray(n_modes) > 0
    table = np.column_stack([np.asarray(x)[filled] for x in (k, p, n_modes, p_lin)])
    np.savetxt(path, table, header=header, fmt=["%.6e", "%.6e", "%d", "%.6e"])


SLAB_DEPTH = 0.25  # density images average the first quarter of the z axis


def run(cfg: SimConfig, cosmo: Cosmology, out_dir, *, progress=True, save_fields=False) -> dict:
    """Run a simulation and write power spectra, plots and a summary to ``out_dir``.

    With several processes all of them compute and process 0 alone writes.
    save_fields: also write the final density contrast (``density.npy``,
    the mesh, float) and the white noise (``white_noise.npy``, the particle
    grid), gathered from all devices. Returns the summary (also written as
    ``summary.json``).
    """
    from distpm.cli import plots  # matplotlib only when outputs are written

    cfg.check_runnable()
    runtime.check_same_everywhere(repr((cfg, cosmo, str(out_dir), save_fields)), "config")
    main = runtime.is_main_process()
    out = Path(out_dir)
    if main:
        out.mkdir(parents=True, exist_ok=True)
    timings = {"steps_s": []}
    t_start = time.perf_counter()
    info = {}
    runs = evolve_with_progress(cosmo, cfg, progress=progress, info=info)
    _, timings["initial_conditions_s"], _ = next(runs)
    written = []
    for state, seconds, final in runs:
        timings["steps_s"].append(seconds)
        if state is None:
            continue
        check_finite(state)
        a = float(state.a)
        delta = distpm.density(state, cfg)
        k, p, n_modes = (runtime.to_host(x) for x in distpm.power_spectrum(delta, cfg))
        p_lin = np.asarray(distpm.linear_power(k, cosmo, a))
        depth = max(1, int(cfg.mesh_shape[2] * SLAB_DEPTH))
        slab = runtime.to_host(jnp.mean(delta[:, :, :depth], axis=2))
        fields = {}
        if save_fields and final:
            fields = {"density.npy": delta, "white_noise.npy": distpm.white_noise(cfg.seed, cfg)}
            fields = {name: runtime.to_host(x) for name, x in fields.items()}
        suffix = "" if final else f"_a{a:.4f}"
        names = [f"power{suffix}.txt", f"power{suffix}.png", f"density{suffix}.png", *fields]
        if main:
            write_power(out / names[0], k, p, n_modes, p_lin)
            plots.power_plot(out / names[1], k, p, n_modes, p_lin, a, cfg)
            plots.density_image(out / names[2], slab, a, cfg, SLAB_DEPTH)
            for name, x in fields.items():
                np.save(out / name, x)
        written += names
    timings["total_s"] = time.perf_counter() - t_start
    summary = {
        "config": cfg.to_dict(),
        "cosmology": {f.name: float(getattr(cosmo, f.name)) for f in dataclasses.fields(cosmo)},
        "timings": timings,
        "outputs": written + ["summary.json"],
        "device_grid": list(cfg.device_grid),
        "devices": [str(d) for d in jax.devices()[: cfg.n_devices]],
        "processes": jax.process_count(),
        "particle_capacity_per_device": cfg.capacity,
        "memory_per_device": {**info, "peak_bytes_in_use": _peak_memory(cfg)},
        "versions": {
            "distpm": distpm.__version__,
            "jax": jax.__version__,
            "numpy": np.__version__,
            "python": platform.python_version(),
        },
    }
    if main:
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
    runtime.barrier("distpm run: outputs written")
    return summary
