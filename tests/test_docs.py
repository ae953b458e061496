"""The documentation: the MkDocs site builds with --strict and its references follow the code;
the README stays a landing page."""

import dataclasses
import importlib.util
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from distpm.config import SimConfig
from distpm.parallel.decomposition import ParallelOptions
from distpm.runfile import HalosConfig, OutputConfig

ROOT = Path(__file__).resolve().parents[1]


def _build(root: Path, site: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's banner about MkDocs 2
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(site)],
        cwd=root, env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    out = tmp_path_factory.mktemp("site")
    result = _build(ROOT, out)
    assert result.returncode == 0, result.stderr[-3000:]
    return out


def _text(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def test_the_reference_lists_every_run_file_key_and_command(site):
    run_file = _text(site, "reference/run-file")
    for cls in (SimConfig, ParallelOptions, OutputConfig, HalosConfig):
        for field in dataclasses.fields(cls):
            if (cls, field.name) == (SimConfig, "parallel"):  # a table of its own
                assert "<code>[parallel]</code>" in run_file
                continue
            assert f"<code>{field.name}</code>" in run_file, (cls.__name__, field.name)
    for key in ("nz_smail", "nz_table", "Omega_m", "preset", "sigma8"):
        assert f"<code>{key}</code>" in run_file, key
    cli = _text(site, "reference/cli")
    for command in ("run", "ics", "plan", "info", "launch"):
        assert f"distpm {command}" in cli, command
    assert "--deterministic" in cli and "--gpus-per-process" in cli
    api = _text(site, "reference/api")
    assert "Run the simulation from white noise" in api  # simulate's docstring
    assert ":func:" not in api  # the Sphinx roles are dropped
    assert "JaxPM / distpm" in _text(site, "benchmarks")  # benchmarks/README.md's table


def test_a_broken_link_fails_the_build(tmp_path):
    shutil.copy(ROOT / "mkdocs.yml", tmp_path)
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    shutil.copytree(ROOT / "benchmarks" / "results", tmp_path / "benchmarks" / "results")
    for page in (ROOT / "benchmarks").glob("**/*.md"):  # the pages docs/benchmarks.md includes
        copy = tmp_path / page.relative_to(ROOT)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(page, copy)
    (tmp_path / "src").mkdir()  # mkdocstrings' path; distpm itself is installed
    page = tmp_path / "docs" / "examples.md"
    page.write_text(page.read_text() + "\nSee [the missing page](nowhere.md).\n")
    result = _build(tmp_path, tmp_path / "site")
    assert result.returncode != 0 and "nowhere.md" in result.stderr, result.stderr[-2000:]


def test_a_key_without_a_meaning_is_a_warning(caplog):
    spec = importlib.util.spec_from_file_location("docs_hooks", ROOT / "docs" / "hooks.py")
    hooks = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(hooks)

    @dataclasses.dataclass(frozen=True)
    class Options:
        """Options.

        first, second: described together,
            over two lines.
        """

        first: int = 1
        second: str = "x"
        third: float = 0.5

    docs = hooks.docstring_entries(Options.__doc__)
    assert docs == {"first": "described together, over two lines.", "second": docs["first"]}
    with caplog.at_level(logging.WARNING, logger="mkdocs.hooks.distpm"):
        table = hooks.key_table(Options, Options(), docs, page="test")
    assert '| `second` | `"x"` | described together, over two lines. |' in table
    assert [r.getMessage() for r in caplog.records] == [
        "test: Options.third has no meaning in its docstring"
    ]


def test_the_readme_is_a_landing_page_with_the_two_commands():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, len(lines)
    assert "python3 -m venv .venv && .venv/bin/pip install . && .venv/bin/distpm run" in lines
    test_command = 'python3 -m venv .venv && .venv/bin/pip install ".[test]" && .venv/bin/pytest'
    assert test_command in lines
