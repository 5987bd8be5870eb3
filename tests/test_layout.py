"""Tests and benches stay apart: no file under tests/ imports a bench script or loads one by its path,
and no file under bench/ imports the tests (what both need lives in the packages: serving/testing.py,
phaselens/testing.py, serving/sim/live_compare.py, serving/devices/published.py, collector/captures/,
collector/store/synthetic.py). The scan reads the real files' syntax trees."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _path_into(folder: str) -> re.Pattern[str]:
    """A string naming ``folder`` or a file in it as a path ("bench/x.py", ".../bench/...", "bench")."""
    return re.compile(rf"^{folder}$|(^|[/\\]){folder}[/\\]")


def _docstrings(tree: ast.AST) -> set[int]:
    """ids of the string constants that are docstrings (prose may name a bench script)."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def crossings(path: Path, forbidden: str) -> list[str]:
    """Where ``path`` reaches into the package or directory ``forbidden`` (``bench`` or ``tests``):
    an import of it, an ``importlib.import_module`` of it, or a string that is a path into it
    (``spec_from_file_location``, ``runpy``, a subprocess running a bench script, a test's data file).
    Docstrings are prose and may name either."""
    tree = ast.parse(path.read_text(), filename=str(path))
    docs = _docstrings(tree)
    into = _path_into(forbidden)
    found: list[str] = []

    def named(module: str | None) -> bool:
        return module is not None and (module == forbidden or module.startswith(forbidden + "."))

    for node in ast.walk(tree):
        where = (
            f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{getattr(node, 'lineno', 0)}"
        )
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if named(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and named(node.module):
            found.append(f"{where}: from {node.module} import ...")
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            text = node.value
            if named(text) and text != forbidden:  # "bench.sim_vs_live" for import_module
                found.append(f"{where}: module name {text!r}")
            elif into.search(text):
                found.append(f"{where}: path {text!r}")
    return found


def _python_files(folder: str) -> list[Path]:
    """The Python files under ``folder``, but this one (the scan names both folders)."""
    here = Path(__file__).resolve()
    return sorted(
        p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts and p.resolve() != here
    )


def test_no_test_imports_or_loads_a_bench_script() -> None:
    files = _python_files("tests")
    assert len(files) > 50
    found = [c for f in files for c in crossings(f, "bench")]
    assert not found, "tests reach into bench/ (move what both need into a package module):\n" + "\n".join(
        found
    )


def test_no_bench_imports_the_tests() -> None:
    files = _python_files("bench")
    assert len(files) >= 10
    found = [c for f in files for c in crossings(f, "tests")]
    assert not found, "bench/ imports the tests (move what both need into a package module):\n" + "\n".join(
        found
    )


def test_the_scan_finds_each_kind_of_crossing(tmp_path: Path) -> None:
    """Each way a test reached a bench before (an import, a path loaded with importlib, a subprocess
    running a bench script) and a bench reached the tests (a plain and a deferred import, a test data
    folder) is found;
    prose in docstrings, test data with "bench" in it and bench-to-bench imports are not crossings."""
    test_file = tmp_path / "test_x.py"
    test_file.write_text(
        '"""Runs what bench/sim_vs_live.py runs at size."""\n'
        "import importlib.util\n"
        "import subprocess\n"
        "from pathlib import Path\n"
        "from bench.sim_vs_live import run_live\n"
        "import bench.fidelity_table\n"
        'FIDELITY = Path(__file__).parents[3] / "bench" / "fidelity_table.py"\n'
        'spec = importlib.util.spec_from_file_location("f", "bench/fidelity_table.py")\n'
        'subprocess.run(["python", "bench/analytics_data.py"])\n'
        'mod = importlib.import_module("bench.overload")\n'
        'UUID = "GPU-bench-50"\n'
    )
    found = crossings(test_file, "bench")
    assert len(found) == 6, found
    assert sorted(int(line.split(":")[1]) for line in found) == [5, 6, 7, 8, 9, 10]

    bench_file = tmp_path / "bench_x.py"
    bench_file.write_text(
        '"""Uses what tests/serving/conftest.py used to hold."""\n'
        "from tests.serving.conftest import start_server\n"
        "def main():\n"
        "    import tests.collector.conftest\n"
        "    from analytics_data import build\n"
        '    return ROOT / "tests" / "collector" / "sources" / "data"\n'
    )
    found = crossings(bench_file, "tests")
    assert sorted(int(line.split(":")[1]) for line in found) == [2, 4, 6], found
