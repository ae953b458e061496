"""MkDocs hook: the parts of the documentation that are generated from the code.

A page asks for one with a marker line:

- ``<!-- distpm:run-file -->``: every run-file key with its default and its meaning, read from
  the dataclasses the run file fills (their docstrings list each field as ``name: meaning``);
- ``<!-- distpm:cli -->``: the ``--help`` of every ``distpm`` command;
- ``<!-- distpm:include PATH -->``: a Markdown file of the repository (``benchmarks/README.md``);
- ``<!-- distpm:results -->``: the machine and date of each file in ``benchmarks/results/``.

A field without a meaning in its docstring is a warning, which ``mkdocs build --strict`` (the
test suite's) turns into an error: the reference cannot fall behind the code.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import logging
import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
log = logging.getLogger("mkdocs.hooks.distpm")
MARKER = re.compile(r"^<!-- distpm:(\S+)(?: (\S+))? -->$", re.MULTILINE)
ENTRY = re.compile(r"^(\w+(?:, \w+)*): (.*)$")


def docstring_entries(text: str) -> dict[str, str]:
    """``name: meaning`` entries of a docstring (continuation lines indented deeper)."""
    entries, current = {}, None
    for line in inspect.cleandoc(text or "").splitlines():
        stripped = line.strip()
        indent = len(line) - len(line.lstrip())
        match = ENTRY.match(stripped)
        if match and indent == 0:
            current = [match.group(2)]
            for name in match.group(1).split(", "):
                entries[name] = current
        elif current is not None and stripped and indent > 0:
            current.append(stripped)
        else:
            current = None
    return {name: " ".join(words) for name, words in entries.items()}


def toml_value(value) -> str:
    if value is None:
        return "(unset)"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return f'"{value}"'
    if isinstance(value, tuple | list):
        if len(value) == 3 and len(set(value)) == 1:
            return toml_value(value[0])
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    return repr(value)


def key_table(cls, defaults, docs: dict[str, str], skip=(), page="") -> str:
    rows = ["| key | default | meaning |", "|---|---|---|"]
    for field in dataclasses.fields(cls):
        if field.name in skip:
            continue
        meaning = docs.get(field.name)
        if meaning is None:
            log.warning(f"{page}: {cls.__name__}.{field.name} has no meaning in its docstring")
            meaning = ""
        default = field.default  # as declared: None for "see the meaning"
        if default is dataclasses.MISSING:
            default = getattr(defaults, field.name)
        meaning = meaning.replace("|", "\\|")
        rows.append(f"| `{field.name}` | `{toml_value(default)}` | {meaning} |")
    return "\n".join(rows)


def run_file_reference(page: str) -> str:
    from distpm.config import SimConfig
    from distpm.cosmology import Cosmology
    from distpm.lightcone.config import LightconeConfig
    from distpm.parallel.decomposition import ParallelOptions
    from distpm.runfile import COSMOLOGY_PRESETS, HalosConfig, OutputConfig

    lightcone_docs = docstring_entries(LightconeConfig.__doc__)
    lightcone_docs |= docstring_entries(LightconeConfig.from_value.__doc__)
    lightcone = key_table(
        LightconeConfig, LightconeConfig(nside=1), lightcone_docs, {"distributions"}, page
    )
    extra = ("nz_smail", "nz_table", "enabled")
    missing = [k for k in extra if k not in lightcone_docs]
    if missing:
        log.warning(f"{page}: LightconeConfig.from_value does not describe {missing}")
    lightcone += "".join(f"\n| `{k}` | | {lightcone_docs.get(k, '')} |" for k in extra)
    presets = ", ".join(f'`"{name}"`' for name in COSMOLOGY_PRESETS)
    cosmology = key_table(
        Cosmology, Cosmology.planck18(), docstring_entries(Cosmology.__doc__), (), page
    )
    cosmology += (
        f'\n| `preset` | `"planck18"` | the parameters the others change: {presets} |'
        "\n| `Omega_m` | | total matter today, instead of `Omega_c` (= Omega_m - Omega_b) |"
    )
    sections = [
        ("Top level: the simulation (`SimConfig`)", SimConfig, SimConfig(), ("parallel",)),
        (
            "`[parallel]`: how the run is split (what `--resume` may change)",
            ParallelOptions,
            ParallelOptions(),
            (),
        ),
        ("`[output]`", OutputConfig, OutputConfig(), ()),
        ("`[halos]` (or `halos = true`)", HalosConfig, HalosConfig(), ()),
    ]
    parts = [
        f"## {title}\n\n{key_table(cls, default, docstring_entries(cls.__doc__), skip, page)}"
        for title, cls, default, skip in sections
    ]
    parts.insert(1, f"## `[cosmology]` (defaults: Planck 2018)\n\n{cosmology}")
    parts.append(f"## `[lightcone]` (defaults when the table is given)\n\n{lightcone}")
    return "\n\n".join(parts)


def cli_reference() -> str:
    from distpm.cli.main import _parser

    os.environ["COLUMNS"] = "96"  # argparse wraps to it
    parser = _parser()
    commands = next(a for a in parser._actions if a.choices and hasattr(a, "add_parser"))
    parts = [f"```\n{parser.format_help()}```"]
    for name, sub in commands.choices.items():
        parts.append(f"## `distpm {name}`\n\n```\n{sub.format_help()}```")
    return "\n\n".join(parts)


def results_provenance() -> str:
    rows = ["| file | date | machine | CPUs |", "|---|---|---|---|"]
    for path in sorted((ROOT / "benchmarks" / "results").glob("*.json")):
        data = json.loads(path.read_text())
        info = {**data, **data.get("provenance", {})}
        date = str(info.get("date") or info.get("date_utc") or "")[:10]
        machine = info.get("machine") or info.get("platform") or ""
        cpus = info.get("cpus") or info.get("cpu_count") or ""
        rows.append(f"| `{path.name}` | {date} | {machine} | {cpus} |")
    return "\n".join(rows)


def on_page_markdown(markdown: str, page, config, files) -> str:
    def generate(match: re.Match) -> str:
        kind, arg = match.groups()
        if kind == "run-file":
            return run_file_reference(page.file.src_path)
        if kind == "cli":
            return cli_reference()
        if kind == "include":
            return (ROOT / arg).read_text().split("\n", 1)[1]  # without its title
        if kind == "results":
            return results_provenance()
        log.warning(f"{page.file.src_path}: unknown marker {match.group(0)}")
        return ""

    return MARKER.sub(generate, markdown)


SPHINX_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data):(?=<code>)")


def on_page_content(html: str, page, config, files) -> str:
    """The docstrings name objects with Sphinx roles (``:func:`x```); drop the role, keep x."""
    return SPHINX_ROLE.sub("", html)
