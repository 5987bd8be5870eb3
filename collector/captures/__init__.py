"""Real and format-faithful ``/metrics`` pages of the systems the collector scrapes (dcgm-exporter,
vLLM, Dynamo; README.md says where each comes from). The collector's source tests and the benches
(bench/ingest.py, bench/exposition.py) read them from here."""

from __future__ import annotations

from pathlib import Path

CAPTURES_DIR = Path(__file__).resolve().parent


def capture(name: str) -> str:
    """The text of the capture ``name`` (a file in :data:`CAPTURES_DIR`, e.g. ``dcgm-exporter-l4.prom``)."""
    path = CAPTURES_DIR / name
    if not path.is_file():
        known = ", ".join(sorted(p.name for p in CAPTURES_DIR.glob("*.prom")))
        raise FileNotFoundError(f"no capture {name!r} in {CAPTURES_DIR}; known: {known}")
    return path.read_text()
