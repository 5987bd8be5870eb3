"""Line-robust parsing of the Prometheus text exposition format, and the HTTP fetch it comes from.

``prometheus_client``'s parser stops at the first bad line. :func:`parse_exposition` parses the
whole text first and, only when that raises, drops the bad lines one by one (counting each as
``malformed_line`` or ``non_numeric``) and parses what is left, so one broken line never costs a scrape.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import httpx
from prometheus_client.parser import text_string_to_metric_families

from collector.sources.base import SourceResult, SourceUnavailable

_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created", "_gsum", "_gcount"),
    "gaugehistogram": ("_bucket", "_gsum", "_gcount"),
    "summary": ("_sum", "_count", "_created"),
}


@dataclass(frozen=True, slots=True)
class Sample:
    """One exposition sample. ``stem`` + ``suffix`` == ``name`` (suffix ``_total``/``_sum``/... or '')."""

    name: str
    stem: str
    suffix: str
    type: str  # counter | gauge | histogram | summary | untyped | ...
    labels: dict[str, str]
    value: float
    timestamp_s: float | None


def parse_exposition(text: str, result: SourceResult) -> list[Sample]:
    """Parse ``text``; bad lines are dropped and counted on ``result``; the rest is returned."""
    try:
        return _to_samples(text)
    except Exception:
        pass
    kept: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        try:
            _to_samples(stripped + "\n")
        except Exception as e:
            kind = "malformed_line" if stripped.startswith("#") else _classify_bad_sample(stripped)
            result.count(kind, f"{_clip(stripped)} ({type(e).__name__}: {e})")
            continue
        kept.append(stripped)
    try:
        return _to_samples("\n".join(kept) + "\n")
    except Exception:
        # Lines that parse alone but not together (e.g. a TYPE clash): fall back to one at a time.
        out: list[Sample] = []
        for line in kept:
            if not line.startswith("#"):
                out.extend(_to_samples(line + "\n"))
        return out


def finite(value: float) -> bool:
    return not (math.isnan(value) or math.isinf(value))


def fetch_text(client: httpx.Client, url: str) -> str:
    """GET ``url``; raise :class:`SourceUnavailable` when it cannot be read."""
    try:
        resp = client.get(url)
    except httpx.TimeoutException as e:
        raise SourceUnavailable("unreachable", f"{url}: timed out ({type(e).__name__})") from e
    except httpx.HTTPError as e:
        raise SourceUnavailable("unreachable", f"{url}: {type(e).__name__}: {e}") from e
    if resp.status_code != 200:
        raise SourceUnavailable("http_status", f"{url}: HTTP {resp.status_code}: {_clip(resp.text)}")
    return resp.text


def split_name(name: str, type_hint: str | None = None) -> tuple[str, str]:
    """Split a sample name into (stem, suffix) when the type does not say (e.g. from a query API)."""
    candidates = _SUFFIXES.get(type_hint or "", ("_bucket", "_sum", "_count", "_total", "_created"))
    for suf in candidates:
        if name.endswith(suf) and len(name) > len(suf):
            return name[: -len(suf)], suf
    return name, ""


def _to_samples(text: str) -> list[Sample]:
    out: list[Sample] = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name = s.name
            if fam.type != "untyped" and name.startswith(fam.name):
                stem, suffix = fam.name, name[len(fam.name) :]
            else:
                stem, suffix = name, ""
            value = float(s.value)
            out.append(Sample(name, stem, suffix, fam.type, dict(s.labels), value, s.timestamp))
    return out


def _classify_bad_sample(line: str) -> Literal["non_numeric", "malformed_line"]:
    """A sample line whose only fault is its value (``... N/A``) is ``non_numeric``."""
    for keep_ts in (False, True):
        parts = line.rsplit(None, 2 if keep_ts else 1)
        if len(parts) < (3 if keep_ts else 2):
            continue
        probe = f"{parts[0]} 0" + (f" {parts[2]}" if keep_ts else "")
        try:
            if _to_samples(probe + "\n"):
                return "non_numeric"
        except Exception:
            continue
    return "malformed_line"


def _clip(s: str, n: int = 160) -> str:
    s = s.strip().replace("\n", " ")
    return s if len(s) <= n else s[: n - 3] + "..."
