"""The plain-page exposition reader against ``prometheus_client``'s parser, the reference it follows.

:func:`_plain_samples` must give exactly the library's samples for every page it reads, and give up
(``_NotPlain``, the whole text then goes to the library) on every line it does not read exactly so.
"""

from __future__ import annotations

import random

import pytest

from collector.captures import CAPTURES_DIR
from collector.sources.base import SourceResult
from collector.sources.exposition import (
    Sample,
    _library_samples,
    _NotPlain,
    _plain_samples,
    _to_samples,
    parse_exposition,
)
from tests.collector.sources import expositions as ex

DATA = CAPTURES_DIR


def _key(samples: list[Sample]) -> list[tuple]:
    # repr: NaN equals NaN, and -0.0 differs from 0.0
    return [(s.name, s.stem, s.suffix, s.type, s.labels, repr(s.value), repr(s.timestamp_s)) for s in samples]


def _outcome(fn, text: str) -> list[tuple] | str:
    try:
        return _key(fn(text))
    except Exception as e:  # the library raises ValueError, and others (IndexError) on some lines
        return f"raises {type(e).__name__}"


def _real_pages() -> dict[str, str]:
    pages = {p.name: p.read_text() for p in sorted(DATA.glob("*.prom"))}
    pages["vllm"] = ex.vllm(prompt=100, gen=1000, ttft=(2.0, 10), itl=(5.0, 990), e2e=(30.0, 10), finished=10)
    pages["sglang"] = ex.sglang(prompt=100, gen=1000, ttft=(2.0, 10), tpot=(5.0, 990))
    pages["dynamo-frontend"] = ex.dynamo(isl=(1000.0, 10), osl=(2000.0, 10), ttft=(2.0, 10))
    return pages


@pytest.mark.parametrize("name", sorted(_real_pages()))
def test_real_exporters_pages_are_read_plain_and_equal_the_library(name: str) -> None:
    text = _real_pages()[name]
    plain = _plain_samples(text)  # raises _NotPlain if a real exporter's line is not covered
    assert len(plain) > 10
    assert _key(plain) == _key(_library_samples(text))


# Pages the plain reader reads, each a rule of the library's family grouping or number reading.
PLAIN = {
    "counter without _total": "# TYPE req counter\nreq 3\n",
    "counter with _total": '# HELP req_total r\n# TYPE req_total counter\nreq_total{a="1"} 3\n',
    "TYPE after the samples": "# HELP foo x\nfoo 1\n# TYPE foo counter\n",
    "histogram, _created ends the family": (
        "# TYPE h histogram\n"
        'h_bucket{le="1",m="a"} 1\nh_count{m="a"} 1\nh_sum{m="a"} 2\nh_created{m="a"} 5\n'
        'h_bucket{le="1",m="b"} 1\nh_count{m="b"} 1\n'
    ),
    "summary": '# TYPE s summary\ns{quantile="0.5"} 1\ns_sum 2\ns_count 3\n',
    "untyped and a HELP-only family": "# HELP a doc\na 1\nb 2\n# HELP c\nc 3\n",
    "gauge then a foreign sample": "# TYPE g gauge\ng 1\ng_total 2\ng 3\n",
    "comments and blank lines, CRLF": "# a comment\n#\n\n# TYPE g gauge\r\ng 1\r\n\r\n",
    "special values and timestamps": "a NaN\nb +Inf\nc -Inf 1700000000000\nd 1e3 -5\ne -0.0\nf 00012\n",
    "empty braces, trailing comma": 'a{} 1\nb{x="1",} 2\n',
    "quotes and unicode in HELP text": '# HELP g the "busy" share — of SMs\n# TYPE g gauge\ng{m="Grüße"} 1\n',
    "label values with # and {": 'g{a="{x # y",b=""} 1\n',
    "a TYPE after another family's HELP": "# HELP a x\n# TYPE b gauge\nb 1\na 2\n",
    "a type the library maps": "# TYPE i info\ni_info 1\n# TYPE u untyped\nu 2\n",
}


@pytest.mark.parametrize("case", sorted(PLAIN))
def test_plain_pages_equal_the_library(case: str) -> None:
    text = PLAIN[case]
    assert _key(_plain_samples(text)) == _key(_library_samples(text))


# Lines the plain reader leaves to the library (which reads some and refuses others).
NOT_PLAIN = {
    "escaped label value": 'g{a="x\\"y"} 1\n',
    "space after a comma": 'g{a="1", b="2"} 1\n',
    "tab separator": "g\t1\n",
    "reserved label name": 'g{__name__="h"} 1\n',
    "exemplar": 'g_total 1 # {trace_id="a"} 1\n',
    "no space before the value": 'g{a="1"}1\n',
    "duplicate label": 'g{a="1",a="2"} 1\n',
    "underscore in the value": "g 1_000\n",
    "value not a number": "g N/A\n",
    "bad TYPE": "# TYPE g gauges\ng 1\n",
    "TYPE without a type": "# TYPE g\ng 1\n",
    "counter named _total": "# TYPE _total counter\n_total 1\n",
    "quoted metric name in TYPE": '# TYPE "g" gauge\ng 1\n',
    "non-ASCII space in a TYPE line": "# TYPE\u00a0g gauge\ng 1\n",
    "three values": "g 1 2 3\n",
    "a closing brace in a label value": 'g{a="x}"} 1\n',
}


@pytest.mark.parametrize("case", sorted(NOT_PLAIN))
def test_lines_not_read_plain_go_to_the_library(case: str) -> None:
    text = NOT_PLAIN[case]
    with pytest.raises(_NotPlain):
        _plain_samples(text)
    assert _outcome(_to_samples, text) == _outcome(_library_samples, text)


_FRAGMENTS = [
    "# HELP m doc",
    "# TYPE m gauge",
    "# TYPE m counter",
    "# TYPE m histogram",
    "# TYPE m summary",
    "# TYPE m_total counter",
    "# HELP n",
    "# a comment",
    "#",
    "",
    "m 1",
    "m_total 2",
    'm_bucket{le="+Inf"} 3',
    "m_sum 4.5",
    "m_count 6",
    "m_created 1.7e9",
    'm{gpu="0",UUID="GPU-1"} 7',
    'm{gpu="1",UUID="GPU-2"} 8 1700000000123',
    "n NaN",
    'n{a=""} -Inf',
]
_MUTATIONS = [
    lambda s: s.replace("=", " = "),
    lambda s: s.replace(" ", "  "),
    lambda s: s.replace(" ", "\t"),
    lambda s: s.replace('"', ""),
    lambda s: s.replace("}", ""),
    lambda s: s.replace("1", "1_0"),
    lambda s: s.replace('="', '="\\"'),
    lambda s: s.replace("m", "m-"),
    lambda s: s.replace("gauge", "gauges"),
    lambda s: s + " x",
    lambda s: s[: len(s) // 2],
    lambda s: "  " + s + " ",
]


def test_random_pages_read_as_the_library_reads_them() -> None:
    """Seeded pages of real and broken fragments: the reader the collector uses (plain, else the
    library) gives the library's samples, or fails where it fails."""
    rng = random.Random(20261202)
    plain_read = 0
    for _ in range(1500):
        lines = []
        for _ in range(rng.randint(1, 8)):
            line = rng.choice(_FRAGMENTS)
            if rng.random() < 0.15:
                line = rng.choice(_MUTATIONS)(line)
            lines.append(line)
        text = "\n".join(lines) + rng.choice(["\n", "", "\r\n"])
        assert _outcome(_to_samples, text) == _outcome(_library_samples, text), text
        try:
            _plain_samples(text)
            plain_read += 1
        except _NotPlain:
            pass
    assert plain_read > 500  # most pages took the plain path, so the comparison above tested it


def test_a_bad_line_is_counted_and_the_rest_read_plain() -> None:
    page = (DATA / "dcgm-exporter-l4.prom").read_text()
    bad = page.replace("} 210\n", "} N/A\n", 1)
    result = SourceResult("x", 0.0)
    samples = parse_exposition(bad, result)
    assert result.error_count("non_numeric") == 1
    assert _key(samples) == [k for k in _key(_library_samples(page)) if k[0] != "DCGM_FI_DEV_SM_CLOCK"]
