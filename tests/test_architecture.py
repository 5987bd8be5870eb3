"""The import contracts of docs/ARCHITECTURE.md hold, and breaking one fails: import-linter (the real
tool, as scripts/test.sh runs it) on the repository, then on a copy with one forbidden import added.
And no package module is over 600 lines without the reason written at its top (issue 21, item 5)."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("phaselens", "dashboard", "analytics", "collector", "serving")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
LAYERS = "layers: phaselens > dashboard > analytics > collector > serving"
SERVING = "serving imports none of the other packages"
DASHBOARD = "the dashboard reads data only through the service API (no store, no DuckDB)"

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter is not installed (.[dev])")


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` on the packages under ``root`` (their source, not the installed copy)."""
    env = os.environ | {"PYTHONPATH": str(root)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", "--no-logo", str(root / "pyproject.toml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    root.mkdir()
    shutil.copy2(REPO / "pyproject.toml", root / "pyproject.toml")
    for pkg in PACKAGES:
        shutil.copytree(REPO / pkg, root / pkg, ignore=shutil.ignore_patterns("__pycache__", "data"))
    return root


def _broken(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.endswith(" BROKEN")]


def test_the_repository_keeps_every_contract():
    r = _lint(REPO)
    assert r.returncode == 0, r.stdout + r.stderr
    for name in (LAYERS, SERVING, DASHBOARD):
        assert f"{name} KEPT" in r.stdout


@pytest.mark.parametrize(
    ("module", "injected", "contracts"),
    [
        # the collector reaching up into the analytics: the cycle this layout removed
        ("collector/client.py", "from analytics.window import epoch_s", [LAYERS]),
        ("serving/trace.py", "import collector.store", [LAYERS, SERVING]),
        ("dashboard/share_bar.py", "import duckdb", [DASHBOARD]),
    ],
)
def test_one_forbidden_import_breaks_its_contract(tmp_path, module, injected, contracts):
    root = _copy(tmp_path)
    assert _lint(root).returncode == 0  # the copy itself is clean
    path = root / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{injected}  # injected by the test\n")
    r = _lint(root)
    assert r.returncode != 0, r.stdout
    assert sorted(_broken(r.stdout)) == sorted(f"{name} BROKEN" for name in contracts), r.stdout
    assert module.removesuffix(".py").replace("/", ".") in r.stdout  # the report names the import


# -- files a newcomer can hold (issue 21, item 5) --------------------------------------------------

MAX_LINES = 600
# "Over 600 lines for a reason: ...", "Just over 700 lines: ..." — a line of the module docstring
REASON = re.compile(r"\bover [\d,]+ lines( for a reason)?:\s*\S", re.IGNORECASE)


def unexplained_long_modules(root: Path, max_lines: int = MAX_LINES) -> list[str]:
    """The package modules under ``root`` (``PACKAGES``; not tests/ or bench/) longer than
    ``max_lines`` lines whose module docstring gives no reason ("Over 600 lines for a reason: ...")."""
    found: list[str] = []
    for pkg in PACKAGES:
        for path in sorted((root / pkg).rglob("*.py")):
            text = path.read_text(encoding="utf-8")
            lines = len(text.splitlines())
            if lines <= max_lines:
                continue
            doc = ast.get_docstring(ast.parse(text, filename=str(path))) or ""
            if not any(REASON.search(line) for line in doc.splitlines()):
                found.append(f"{path.relative_to(root)}: {lines} lines")
    return found


def test_no_package_module_is_over_600_lines_without_a_reason_at_its_top():
    assert unexplained_long_modules(REPO) == [], (
        "split these modules, or write at the top of the module docstring why one file holds it all "
        "('Over 600 lines for a reason: ...')"
    )


def test_a_long_module_without_a_reason_is_named(tmp_path):
    body = "".join(f"X{i} = {i}\n" for i in range(MAX_LINES))
    files = {
        "serving/long.py": '"""A long module."""\n' + body,
        "analytics/long_ok.py": '"""A long module.\n\nOver 600 lines for a reason: one table.\n"""\n' + body,
        "collector/short.py": '"""Short."""\n' + body[: -len(f"X{MAX_LINES - 1} = {MAX_LINES - 1}\n")],
        "phaselens/reason_in_code.py": '"""No reason here."""\n# Over 600 lines for a reason: not a docstring\n'
        + body,
        "tests/long_test.py": '"""A long test module."""\n' + body,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text, encoding="utf-8")
    for pkg in PACKAGES:
        (tmp_path / pkg).mkdir(exist_ok=True)
    assert unexplained_long_modules(tmp_path) == [
        f"phaselens/reason_in_code.py: {MAX_LINES + 2} lines",
        f"serving/long.py: {MAX_LINES + 1} lines",
    ]
