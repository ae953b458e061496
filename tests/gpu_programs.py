"""Compile a representative set of distpm's programs for an H100, with no GPU: what
tests/test_gpu_compile.py reads (run in its own process, where jax's CUDA plugin is on the
path; see that file). Writes JSON: per program, what its GPU program holds
(:mod:`distpm.compiled`) and its memory.

python tests/gpu_programs.py OUT.json
"""

import json
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

import distpm
from distpm import compiled, plan
from distpm.analysis import filter as field_filter
from distpm.analysis import morton, neighbours, power
from distpm.lightcone import LightconeConfig
from distpm.parallel import targets
from distpm.parallel.decomposition import Decomposition
from distpm.parallel.devices import compiling_for
from distpm.pipeline import run_observers
from distpm.runfile import HalosConfig, OutputConfig

COSMO = distpm.Cosmology.planck18()
HALOS = HalosConfig(enabled=True)
DETERMINISTIC = {
    "xla_gpu_deterministic_ops": True,
    "xla_gpu_enable_scatter_determinism_expander": True,
}


def _report(lowered, options=None) -> dict:
    t0 = time.perf_counter()
    program = lowered.compile(compiler_options=options)
    hlo = program.as_text()
    out = compiled.summary(hlo)
    out["platform_choices"] = sorted(
        f"{p}:{f}" for p, f in compiled.platform_choices(lowered.as_text(debug_info=True))
    )
    out["total_bytes"] = plan.memory_per_device(program)["total_bytes"]
    out["compile_s"] = time.perf_counter() - t0
    return out


def _extra_programs(cfg) -> dict:
    """{name: lowered} of the analyses that ``distpm plan`` does not list."""
    state, dec = plan.abstract_state(cfg), Decomposition.of(cfg)
    field = jax.ShapeDtypeStruct(cfg.mesh_shape, cfg.float_dtype, sharding=dec.sharding())
    keys = jax.ShapeDtypeStruct((dec.slots, 2), jnp.uint32, sharding=state.mask.sharding)
    bucket = morton.sort_bucket(dec)
    steps = neighbours.knn_cells.radii(cfg, 8, 1.0)  # one pass: a short compile
    return {
        "knn": neighbours._knn.lower(state, cfg, 8, steps, None, 2.0),
        "morton_sort": morton._sort.lower(state, keys, cfg, bucket, dec.capacity, None, True),
        "multipoles": jax.jit(lambda d: power.multipoles(d, cfg)).lower(field),
        "filter": jax.jit(lambda f: field_filter.filter_field(f, cfg, lambda k: 1 / (1 + k))).lower(
            field
        ),
    }


def programs(grid, integrator, extra) -> dict:
    """The run's programs (``distpm plan``'s, with the gradient, and halos with FastPM's
    integrator); with ``extra`` the step with a lightcone and P(k) every 2 steps, the
    analyses, and the density's program with XLA's determinism flags."""
    cfg = distpm.SimConfig(box_size=128.0, mesh_shape=32, n_steps=4, integrator=integrator)
    cfg = cfg.on(grid)
    out = {}
    with compiling_for(targets.devices("h100", grid[0] * grid[1])):
        made = plan._programs(COSMO, cfg, True, HALOS if integrator == "fastpm" else None)
        if extra:  # observers ride on the drifts (FastPM's here; the 2LPT integrator's alike)
            lightcone = LightconeConfig(source_redshifts=(1.0,), nside=8)
            observers = tuple(run_observers(COSMO, cfg, OutputConfig(power_every=2), lightcone))
            made["step_observed"] = plan._programs(COSMO, cfg, False, None, observers)["step"]
        for name, (fn, args, kwargs) in made.items():
            lowered = fn.lower(*args, **kwargs)
            out[name] = _report(lowered)
            if name == "output_density" and extra:
                out[f"{name}_deterministic"] = _report(lowered, DETERMINISTIC)
        if extra:
            out.update({name: _report(low) for name, low in _extra_programs(cfg).items()})
    return out


def detector_programs() -> dict:
    """A host callback and a loop whose trip count depends on data: the readers of
    :mod:`distpm.compiled` must see both (else their zeros prove nothing). XLA refuses to
    lower the callback for a GPU without one: it is read from the CPU's program, and the
    GPU's refusal is recorded."""

    def with_callback(x):
        jax.debug.callback(lambda v: None, x)
        return x + 1

    def with_loop(x):
        return jax.lax.while_loop(lambda c: c[0] < c[1], lambda c: (c[0] + 1, c[1]), (0, x))[0]

    device = targets.devices("h100", 1)[0]
    x = jax.ShapeDtypeStruct((), jnp.int32, sharding=jax.sharding.SingleDeviceSharding(device))
    out = {"callback_on_cpu": _report(jax.jit(with_callback).lower(1))}
    with compiling_for([device]):
        out["loop"] = _report(jax.jit(with_loop).lower(x))
        try:
            jax.jit(with_callback).lower(x).compile()
            out["callback_on_gpu"] = "compiled"
        except Exception as err:  # what a GPU compile of a program with a callback meets
            out["callback_on_gpu"] = f"{type(err).__name__}: {err}"
    return out


def main(path):
    t0 = time.perf_counter()
    result = {
        "1x1": programs((1, 1), "fastpm", extra=True),
        "1x1_2lpt": programs((1, 1), "2lpt", extra=False),
        "2x2": programs((2, 2), "fastpm", extra=False),
        "detector": detector_programs(),
        "platform": str(targets.devices("h100", 1)[0].platform),
        "devices": str(targets.devices("h100", 1)[0].device_kind),
    }
    result["seconds"] = time.perf_counter() - t0
    with open(path, "w") as f:
        json.dump(result, f, indent=1, default=lambda v: np.asarray(v).tolist())


if __name__ == "__main__":
    main(sys.argv[1])
