"""Collectives of a compiled HLO module: kind, mesh axis, role and bytes of each.

Every collective instruction of the module text is counted once (async
``-start``/``-done`` pairs once), with the bytes of its result per device.
A step's migration first tries a neighbours-only exchange and falls back to
the full one inside a ``lax.cond`` (:mod:`distpm.parallel.migrate`): the
program holds both, a step runs one. Their ops are told apart by the name
scopes in their ``op_name`` metadata; :func:`summarise` gives the bytes a
step sends on the neighbours' path and, apart, those of the fallback.
"""

import math
import re

KINDS = ("all-to-all", "collective-permute", "all-reduce", "all-gather", "reduce-scatter")
DTYPE_BYTES = {
    "pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2,
    "s32": 4, "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
}  # fmt: skip
INSTRUCTION = re.compile(
    r"^\s*(?:ROOT\s+)?%?(?P<name>\S+) = (?P<shape>.+?) (?P<op>[a-z][a-z0-9-]*)\((?P<args>[^)]*)\)"
    r"(?P<attrs>.*)$"
)
ARRAY = re.compile(r"\b([a-z]+[0-9]*)\[([0-9,]*)\]")
GROUPS = re.compile(r"(?:replica_groups|source_target_pairs)=\{(.*?)\}\}")


def shape_bytes(shape: str) -> int:
    """Bytes of an HLO shape such as ``f32[32,16,33]{2,1,0}`` or a tuple of them."""
    return sum(
        DTYPE_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
        for dtype, dims in ARRAY.findall(shape)
    )


def mesh_axis(attrs: str, grid) -> str:
    """Mesh axis of a collective's device groups: "x", "y", or "xy" (both)."""
    groups = [
        [int(d) for d in g.split(",")]
        for g in re.findall(r"([0-9][0-9,]*)", GROUPS.search(attrs).group(1))
    ]
    py = grid[1]
    if all(len({d % py for d in g}) == 1 for g in groups):
        return "x"
    if all(len({d // py for d in g}) == 1 for g in groups):
        return "y"
    return "xy"


OP_NAME = re.compile(r'op_name="([^"]*)"')
FALLBACK = "migration (fallback)"


def role(kind: str, dtypes, op_name: str = "") -> str:
    """What a collective of distpm's step does, from its name scope, kind and dtypes."""
    if "migrate_neighbours" in op_name:
        return "migration (neighbours)"
    if "migrate_all" in op_name:
        return FALLBACK if "/branch_" in op_name else "migration"
    if kind == "all-to-all":
        return "fft transpose" if any(d.startswith("c") for d in dtypes) else "migration"
    return {"collective-permute": "halo", "all-reduce": "reduction"}.get(kind, "other")


def collective_ops(hlo: str, grid) -> list[dict]:
    """Every collective instruction of an HLO module with its kind, axis, role and bytes.

    Bytes are those of the result per device (tuple results summed); an async
    ``-start`` takes the result of its ``-done``.
    """
    instructions = [m for m in map(INSTRUCTION.match, hlo.splitlines()) if m]
    done_shape = {
        m["args"].split()[-1].lstrip("%"): m["shape"]
        for m in instructions
        if m["op"].endswith("-done")
    }
    ops = []
    for m in instructions:
        kind = m["op"].removesuffix("-start")
        if kind not in KINDS:
            continue
        shape = done_shape[m["name"]] if m["op"].endswith("-start") else m["shape"]
        dtypes = sorted({dtype for dtype, _ in ARRAY.findall(shape)})
        op_name = OP_NAME.search(m["attrs"])
        ops.append(
            {
                "kind": kind,
                "axis": mesh_axis(m["attrs"], grid),
                "role": role(kind, dtypes, op_name.group(1) if op_name else ""),
                "dtypes": dtypes,
                "bytes": shape_bytes(shape),
            }
        )
    return ops


def summarise(ops) -> dict:
    """Count and bytes per kind of collective and in total, on a step's usual path
    (without the migration's fallback), and per role ("roles", all ops)."""
    out = {kind: {"count": 0, "bytes": 0} for kind in (*KINDS, "total")}
    roles = {}
    for op in ops:
        entry = roles.setdefault(op["role"], {"count": 0, "bytes": 0})
        entry["count"] += 1
        entry["bytes"] += op["bytes"]
        if op["role"] == FALLBACK:
            continue
        for key in (op["kind"], "total"):
            out[key]["count"] += 1
            out[key]["bytes"] += op["bytes"]
    return {**out, "roles": roles}
