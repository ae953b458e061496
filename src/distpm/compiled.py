"""What a compiled program holds, read from its optimised HLO (``compiled.as_text()``).

The properties a GPU cares about and a CPU run cannot show:

- host callbacks (``jax.debug.callback``, ``pure_callback``): a device-to-host
  round trip each time the program reaches one;
- ``while`` loops, and whether XLA knows their trip count: one it does not know
  (it depends on data) makes a GPU copy the loop's predicate to the host at every
  iteration;
- conditionals (``lax.cond``, ``lax.switch``): a GPU reads the branch index on the
  host once each time;
- the precision of float32 matrix products (``HIGHEST``: no TF32);
- float scatter-adds, and whether they are XLA's deterministic form;
- which form of each :func:`distpm.ops.platform.by_platform` choice was kept.
"""

from __future__ import annotations

import re

INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>\S+) = (?P<shape>.+?) (?P<op>[a-z][a-z0-9-]*)\("
)
CALLBACK = re.compile(r'custom_call_target="([^"]*callback[^"]*)"')
TRIP_COUNT = re.compile(r'"known_trip_count":\{"n":"(\d+)"')
OP_NAME = re.compile(r'op_name="([^"]*)"')
CHOICE = re.compile(r"by_platform_(cpu|gpu)/(\w+)")


def instructions(hlo: str):
    """(name, result shape, opcode, the whole line) of every instruction of ``hlo``."""
    for line in hlo.splitlines():
        m = INSTRUCTION.match(line)
        if m:
            yield m["name"], m["shape"], m["op"], line


def host_callbacks(hlo: str) -> list[str]:
    """The targets of the custom calls that run Python on the host."""
    found = (CALLBACK.search(line) for _, _, op, line in instructions(hlo) if op == "custom-call")
    return [m.group(1) for m in found if m]


def loops(hlo: str) -> list[dict]:
    """Every ``while``: its trip count where XLA knows it (None: it depends on data) and the
    name scope of the code that made it."""
    out = []
    for name, _, op, line in instructions(hlo):
        if op == "while":
            trips = TRIP_COUNT.search(line)
            count = int(trips.group(1)) if trips else None
            out.append({"name": name, "trip_count": count, "made_by": _made_by(line)})
    return out


def _made_by(line: str) -> str:
    where = OP_NAME.search(line)
    return where.group(1) if where else ""


def conditionals(hlo: str) -> list[str]:
    """The name scope of the code that made each conditional."""
    return [_made_by(line) for _, _, op, line in instructions(hlo) if op == "conditional"]


def float_products(hlo: str) -> list[str]:
    """The precision of each matrix product (``dot``, cuBLAS's and cuDNN's calls) of floats:
    "highest" where every operand asks for it, else what the line says."""
    out = []
    for _, shape, op, line in instructions(hlo):
        gemm = op == "custom-call" and re.search(r'custom_call_target="__cu(blas|dnn)', line)
        if (op in ("dot", "convolution") or gemm) and re.match(r"\(?f(32|64)", shape):
            found = re.search(r"operand_precision[\"=:{\[]+([^}\]]*)", line)
            words = found.group(1).split(",") if found else ["default"]
            levels = {x.strip().strip('"').lower() for x in words}
            out.append("highest" if levels == {"highest"} else ",".join(sorted(levels)))
    return out


def scatters(hlo: str) -> list[dict]:
    """Every float ``scatter``: whether XLA may run it with atomic adds in any order
    (``unique_indices=false``: not XLA's deterministic form)."""
    return [
        {"shape": shape, "unordered": "unique_indices=true" not in line}
        for _, shape, op, line in instructions(hlo)
        if op == "scatter" and re.match(r"\(?(f|c|bf)\d", shape)
    ]


def platform_choices(hlo: str) -> set[tuple[str, str]]:
    """{(platform, function)} of the :func:`~distpm.ops.platform.by_platform` forms kept."""
    return {(m.group(1), m.group(2)) for m in CHOICE.finditer(hlo)}


def summary(hlo: str) -> dict:
    """Counts of the above: what ``distpm plan`` and the benchmarks report per program."""
    found = loops(hlo)
    return {
        "host_callbacks": len(host_callbacks(hlo)),
        "while_loops": len(found),
        "data_dependent_loops": sum(loop["trip_count"] is None for loop in found),
        "conditionals": len(conditionals(hlo)),
        "float_products": len(float_products(hlo)),
        "float_products_below_highest": sum(p != "highest" for p in float_products(hlo)),
        "unordered_float_scatters": sum(s["unordered"] for s in scatters(hlo)),
    }
