"""The collector API's edges: every time parameter of every endpoint checked the same way, every
error (a bad value, an unknown route, a wrong method, an unexpected failure) JSON in the documented
shape, and /openapi.json — real HTTP against real collectors on real DuckDB files."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from collector.store import Store
from tests.collector.conftest import start_collector
from tests.serving.conftest import free_port

SHAPE = {"message", "type", "param", "code"}
ANALYTICS = ("summary", "overview", "histogram", "gpu-series")
NOW_S = time.time()


@pytest.fixture(scope="module")
def url(tmp_path_factory) -> Iterator[str]:
    db = tmp_path_factory.mktemp("api") / "api.duckdb"
    proc, base = start_collector(db, "--report-schedule", "off")
    yield base
    proc.terminate()
    proc.wait(timeout=60)


def _error(r: httpx.Response, status: int, param: str | None) -> dict:
    """The error of ``r``, checked: its status, JSON in the documented shape, the parameter named."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"].startswith("application/json"), r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == SHAPE, body
    err = body["error"]
    assert err["code"] == status and err["param"] == param and err["message"], body
    return err


@pytest.mark.parametrize(
    ("path", "params", "param", "says"),
    [
        # the issue's cases: a plain-text 500 (OverflowError / OSError in time.gmtime), and a 200
        ("analytics/summary", {"since": "99999999999999999999999999d"}, "since", "at most 36500d"),
        ("analytics/overview", {"since": "99999999999999999999999999d"}, "since", "at most 36500d"),
        ("analytics/summary", {"end_s": "9e18"}, "end_s", "is after 9999-12-31 23:59:59 UTC"),
        ("analytics/overview", {"end_s": "9e18"}, "end_s", "is after 9999-12-31 23:59:59 UTC"),
        ("analytics/histogram", {"end_s": "9e18"}, "end_s", "up to 253402300799"),
        ("tables/requests", {"start": "nan"}, "start", "start must be finite UTC epoch seconds"),
        ("tables/requests", {"end": "inf"}, "end", "end must be finite UTC epoch seconds"),
        ("latest", {"since_s": "nan"}, "since_s", "since_s must be finite UTC epoch seconds"),
        ("analytics/summary", {"start_s": "nan"}, "start_s", "start_s must be finite"),
        ("analytics/summary", {"since": "1h", "start_s": str(NOW_S - 60)}, "since", "not both"),
        ("analytics/summary", {"start_s": str(NOW_S), "end_s": str(NOW_S - 60)}, "end_s", "is not after"),
        ("analytics/summary", {"end_s": "946684900"}, "end_s", "would start at 1999-12-31 23:01:40 UTC"),
    ],
)
def test_the_issue_cases_are_400s_naming_the_parameter_and_what_is_allowed(url, path, params, param, says):
    err = _error(httpx.get(f"{url}/api/v1/{path}", params=params, timeout=60), 400, param)
    assert says in err["message"] and err["type"] == "invalid_request_error"


@pytest.mark.parametrize("since", ["1h", "3650d", "5000d", "9000d", "9400d", "36500d", "36501d", "0s", "-1h"])
def test_summary_and_overview_accept_and_reject_the_same_spans(url, since):
    summary = httpx.get(f"{url}/api/v1/analytics/summary", params={"since": since}, timeout=120)
    overview = httpx.get(f"{url}/api/v1/analytics/overview", params={"since": since}, timeout=120)
    assert summary.status_code == overview.status_code, (summary.text[:300], overview.text[:300])
    if summary.status_code == 400:
        assert summary.json()["error"]["param"] == overview.json()["error"]["param"] == "since"
        return
    assert summary.status_code == 200
    if since in ("5000d", "9000d"):
        # the period before reaches back before 2000: no trend, said why (it was a 400 on start_s)
        body = overview.json()
        assert body["previous_window"] is None
        figure = body["figures"]["output_tokens_per_s"]
        assert figure["previous"] is None
        assert "the previous period would start before 2000-01-01" in figure["previous_no_data"]


def test_unknown_routes_and_wrong_methods_are_json_in_the_shape(url):
    err = _error(httpx.get(f"{url}/api/v1/nope"), 404, None)
    assert err["type"] == "not_found_error" and "no route GET /api/v1/nope" in err["message"]
    assert "/api/v1/analytics/summary" in err["message"]  # the routes that exist
    err = _error(httpx.get(f"{url}/api/v1/tables/nope"), 404, "table")
    assert "unknown table 'nope'; tables:" in err["message"]
    _error(httpx.get(f"{url}/api/v1/reports/nope"), 404, "report_id")
    r = httpx.post(f"{url}/health")
    err = _error(r, 405, None)
    assert (
        r.headers["allow"] == "GET"
        and err["message"] == "method POST is not allowed on /health; allowed: GET"
    )
    assert "allowed: GET, POST" in _error(httpx.delete(f"{url}/api/v1/reports"), 405, None)["message"]
    err = _error(httpx.get(f"{url}/api/v1/tables/requests", params={"limit": "x"}), 400, "limit")
    assert "invalid parameter 'limit'" in err["message"]


def test_openapi_lists_every_route(url):
    r = httpx.get(f"{url}/openapi.json", timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/json")
    paths = r.json()["paths"]
    for path in (
        "/health",
        "/metrics",
        "/api/v1/tables",
        "/api/v1/tables/{table}",
        "/api/v1/latest",
        "/api/v1/scenarios",
        "/api/v1/import",
        "/api/v1/reports",
        "/api/v1/reports/{report_id}",
        *(f"/api/v1/analytics/{a}" for a in ANALYTICS),
    ):
        assert path in paths, sorted(paths)
    assert set(paths["/api/v1/reports"]) == {"get", "post"}


# -- fuzz: many bad values of each time parameter of each endpoint ---------------------------------

_NOT_NUMBERS = ["nan", "NaN", "-nan", "inf", "-inf", "Infinity", "1e400", "-1e400", "abc", "", " ", "1h"]
_NOT_NUMBERS += ["0x10", "1,5", "1e", "--1", "\x00", "1e309", "٣e400", "None", "[1]", "1 2"]
_BAD_EPOCHS = [*_NOT_NUMBERS, "9e18", "253402300800", "1e16", "-1", "-0.5", "-9e18"]
_BAD_WINDOW_EPOCHS = [*_BAD_EPOCHS, "0", "3600", "946684799", "1e-300"]  # a window starts from 2000
_BAD_SPANS = [*_NOT_NUMBERS, "99999999999999999999999999d", "36501d", "3153600001", "0", "0s", "-1h"]
_BAD_SPANS += ["-0", "h", "1x", "nans", "infd", "1e400d", "1e-400"]


def _random_bad(rng: random.Random, spans: bool) -> list[str]:
    """Seeded values outside the allowed ranges, and text that is no number at all."""
    out = []
    for _ in range(20):
        exp = rng.randint(12, 308)
        out.append(
            f"{rng.choice(['', '-'])}{rng.random() * 9 + 1:.3f}e{exp}" + (rng.choice("smhd") if spans else "")
        )
        out.append(
            f"-{rng.random() * 10 ** rng.randint(0, 9):.3f}" + (rng.choice(["", "s", "d"]) if spans else "")
        )
        out.append("".join(rng.choice("0123456789.eE+-nainfx dhms%&;'\"") for _ in range(rng.randint(1, 12))))
    return out


def _is_number_in(text: str, lo: float, hi: float, spans: bool) -> bool:
    """Whether a random ``text`` happens to be a valid value (then the fuzz skips it)."""
    t = text.strip().lower()
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    try:
        v = float(t[:-1]) * units[t[-1]] if spans and t and t[-1] in units else float(t)
    except (ValueError, KeyError, OverflowError):
        return False
    return v == v and lo <= v <= hi


def _cases() -> list[tuple[str, str, str, list[str]]]:
    rng = random.Random(20)
    cases = []
    for what in ANALYTICS:
        cases.append(("GET", f"analytics/{what}", "since", _BAD_SPANS + _random_bad(rng, spans=True)))
        for p in ("start_s", "end_s"):
            cases.append(("GET", f"analytics/{what}", p, _BAD_WINDOW_EPOCHS + _random_bad(rng, spans=False)))
    for p in ("start", "end"):
        cases.append(("GET", "tables/gpu_samples", p, _BAD_EPOCHS + _random_bad(rng, spans=False)))
    cases.append(("GET", "latest", "since_s", _BAD_EPOCHS + _random_bad(rng, spans=False)))
    cases.append(("POST", "reports", "since", _BAD_SPANS + _random_bad(rng, spans=True)))
    for p in ("start_s", "end_s"):
        cases.append(("POST", "reports", p, _BAD_WINDOW_EPOCHS + _random_bad(rng, spans=False)))
    return cases


@pytest.mark.parametrize(
    ("method", "path", "param", "values"), _cases(), ids=lambda c: c if isinstance(c, str) else ""
)
def test_bad_time_parameters_are_400s_in_the_shape_on_every_endpoint(url, method, path, param, values):
    spans = param == "since"
    lo = 0.0 if path.startswith(("tables", "latest")) else 946_684_800.0
    checked = 0
    with httpx.Client(base_url=f"{url}/api/v1", timeout=60) as c:
        for value in values:
            if _is_number_in(
                value, 1e-9 if spans else lo, 3_153_600_000 if spans else 253_402_300_799, spans
            ):
                continue  # a random draw that is allowed
            if method == "GET":
                r = c.get(f"/{path}", params={param: value})
            else:  # a report's body: the string, and where it parses, the JSON number too
                r = c.post(f"/{path}", json={param: value})
            err = _error(r, 400, param)
            says = ("36500d",) if spans else ("UTC epoch seconds", "up to 253402300799")
            assert all(x in err["message"] for x in says), (value, err)
            checked += 1
    assert checked >= len(values) // 2
    assert httpx.get(f"{url}/health", timeout=10).json()["status"] == "ok"  # nothing took it down


def test_reports_take_the_same_window_checks_with_json_numbers(url):
    for body, param in (
        ({"end_s": 9e18}, "end_s"),
        ({"start_s": -1}, "start_s"),
        ({"start_s": 3600}, "start_s"),
        ({"since": "99999999999999999999999999d"}, "since"),
        ({"since": "1h", "start_s": NOW_S - 60}, "since"),
    ):
        _error(httpx.post(f"{url}/api/v1/reports", json=body, timeout=60), 400, param)
    # nothing stored on the way
    assert httpx.get(f"{url}/api/v1/reports", timeout=10).json()["reports"] == []


# -- an unexpected failure: a JSON 500, never a plain-text page -------------------------------------


def test_an_unexpected_failure_is_a_json_500_naming_it(tmp_path):
    """The real app on a real store, served by uvicorn over a socket, with one route that fails as no
    route should (a fault injected: nothing in the API fails so on purpose)."""
    import uvicorn

    from collector.service import Collector, CollectorSettings
    from phaselens.api import create_service_app

    settings = CollectorSettings(db_path=str(tmp_path / "boom.duckdb"), nvml=False, report_schedules=())
    app = create_service_app(Collector(settings, Store.open(settings.db_path)))

    def sync_boom() -> None:
        raise OverflowError("timestamp out of range for platform time_t")

    async def async_boom() -> None:
        raise KeyError("nope")

    app.add_api_route("/api/v1/boom", sync_boom)
    app.add_api_route("/api/v1/aboom", async_boom)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="critical"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 60
        while not server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        base = f"http://127.0.0.1:{port}"
        err = _error(httpx.get(f"{base}/api/v1/boom"), 500, None)
        assert err["type"] == "server_error"
        assert err["message"] == (
            "GET /api/v1/boom failed on the collector: OverflowError: timestamp out of range for platform time_t"
        )
        assert "KeyError: 'nope'" in _error(httpx.get(f"{base}/api/v1/aboom"), 500, None)["message"]
        assert httpx.get(f"{base}/health").status_code == 200  # and it serves on
    finally:
        server.should_exit = True
        thread.join(timeout=60)


def test_a_time_beyond_the_calendar_is_shown_as_given_never_raised():
    from analytics.window import utc

    # time.gmtime raises OverflowError / OSError here: a message naming such a time must not fail
    assert utc(9e18) == "9e+18 s" and utc(-9e18) == "-9e+18 s"
    assert utc(9e18, same_day_as=1.0) == "9e+18 s" and utc(1.0, same_day_as=9e18) == "1970-01-01 00:00:01 UTC"
    assert utc(253_402_300_799.0) == "9999-12-31 23:59:59 UTC"
