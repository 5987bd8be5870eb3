"""The repository's docs stand on their own: every relative link in the README and docs/ resolves
to a file inside the repository (a clone has no ``../shared``)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _markdown_files() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    files += sorted(
        p
        for pkg in ("serving", "collector", "analytics", "dashboard", "phaselens", "tests")
        for p in (REPO / pkg).rglob("README.md")
    )
    return files


def test_every_relative_link_resolves_inside_the_repository() -> None:
    broken: list[str] = []
    for md in _markdown_files():
        for target in LINK.findall(md.read_text(encoding="utf-8")):
            if re.match(r"[a-z]+:", target) or target.startswith("#"):
                continue  # a URL or an anchor on the same page
            path = (md.parent / target.split("#", 1)[0]).resolve()
            if not path.is_relative_to(REPO) or not path.exists():
                broken.append(f"{md.relative_to(REPO)} -> {target}")
    assert not broken, "links that leave the repository or lead nowhere:\n" + "\n".join(broken)


def test_the_design_document_is_in_the_repository() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "](docs/DESIGN.md)" in readme
    assert (REPO / "docs" / "DESIGN.md").is_file()
