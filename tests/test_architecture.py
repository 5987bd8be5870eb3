"""The import contracts of docs/ARCHITECTURE.md hold, and breaking one fails: import-linter (the real
tool, as scripts/test.sh runs it) on the repository, then on a copy with one forbidden import added."""

from __future__ import annotations

import os
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
