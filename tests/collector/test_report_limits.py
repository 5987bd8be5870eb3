"""Report storage is bounded (count and bytes, the oldest pruned first, every prune counted in
/health and the reports list) and manual reports are rate-limited (429 with Retry-After) while the
schedules run on — real collectors over HTTP on real DuckDB files."""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import pytest

from collector.report_limits import TokenBucket
from phaselens.cli import main
from tests.collector.conftest import start_collector


@contextmanager
def _collector(db, *args: str) -> Iterator[str]:
    proc, url = start_collector(db, *args)
    try:
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def _post(url: str, **body) -> httpx.Response:
    return httpx.post(f"{url}/api/v1/reports", json=body or {"since": "1h"}, timeout=120)


def _reports(url: str) -> dict:
    return httpx.get(f"{url}/health", timeout=30).json()["reports"]


@pytest.mark.timeout(240)
def test_a_flood_of_manual_reports_is_bounded_pruned_oldest_first_counted_and_rate_limited(tmp_path):
    # every 5 s (a seconds field first): the scheduled run comes within seconds of the flood, not at the
    # next whole minute
    args = ("--report-schedule", "every5s=*/5 * * * * *", "--report-max-count", "3")
    with _collector(
        tmp_path / "flood.duckdb", *args, "--report-burst", "6", "--report-rate-per-min", "0.01"
    ) as url:
        made = []
        for _ in range(6):
            r = _post(url)
            assert r.status_code == 200, r.text
            made.append(r.json()["report_id"])
        refused = _post(url)
        assert refused.status_code == 429
        assert int(refused.headers["retry-after"]) > 60  # one every 100 min: the next in ~100 min
        err = refused.json()["error"]
        assert set(err) == {"message", "type", "param", "code"}
        assert err["type"] == "rate_limit_error" and err["code"] == 429
        assert "6 at once, then 0.01 a minute" in err["message"] and "--report-rate-per-min" in err["message"]
        refused_at = time.time()

        listing = httpx.get(f"{url}/api/v1/reports", timeout=30).json()
        assert len(listing["reports"]) <= 3 and listing["stored"]["count"] == len(listing["reports"])
        assert listing["max"]["count"] == 3 and listing["pruned"]["count"] >= 3
        assert made[-1] in [r["report_id"] for r in listing["reports"]]  # the newest kept
        assert (
            httpx.get(f"{url}/api/v1/reports/{made[0]}", timeout=30).status_code == 404
        )  # the oldest pruned
        health = _reports(url)
        assert health["manual_rate"] == {"burst": 6, "per_min": 0.01, "refused": 1}
        assert health["pruned"]["bytes"] > 0 and health["stored"]["bytes"] > 0

        # the schedule runs on (it is not rate-limited) and stays within the bounds too
        deadline = time.monotonic() + 90
        scheduled: list[dict] = []
        while time.monotonic() < deadline and not scheduled:
            listed = httpx.get(f"{url}/api/v1/reports", params={"kind": "every5s"}, timeout=30).json()[
                "reports"
            ]
            scheduled = [r for r in listed if r["end_s"] >= refused_at - 1]
            time.sleep(0.5)
        assert scheduled, "no scheduled report after the manual ones were rate-limited"
        after = _reports(url)
        assert after["stored"]["count"] <= 3 and after["pruned"]["count"] >= 4
        assert after["last_error"] is None


def test_the_bounds_hold_across_restarts_and_on_bytes(tmp_path):
    db = tmp_path / "bounds.duckdb"
    off = ("--report-schedule", "off")
    with _collector(db, *off, "--report-burst", "10") as url:
        for _ in range(4):
            assert _post(url).status_code == 200
        four = _reports(url)["stored"]
    assert four["count"] == 4
    each_mib = four["bytes"] / 4 / 2**20

    # bounds lowered between runs: pruned at start, counted
    with _collector(db, *off, "--report-max-count", "2") as url:
        health = _reports(url)
        assert health["stored"]["count"] == 2 and health["pruned"]["count"] == 2
        kept = [r["ts_s"] for r in httpx.get(f"{url}/api/v1/reports", timeout=30).json()["reports"]]
        assert len(kept) == 2

    # a byte bound that holds one report and a half: each new one prunes the one before
    bound_mib = round(each_mib * 1.5, 4)
    with _collector(db, *off, "--report-max-mib", str(bound_mib)) as url:
        assert _reports(url)["stored"]["count"] == 1
        for _ in range(2):
            assert _post(url).status_code == 200
            health = _reports(url)
            assert health["stored"]["count"] == 1 and health["stored"]["bytes"] <= bound_mib * 2**20
        assert health["pruned"]["count"] == 3  # one at start, one per report

    # a report larger than the whole bound is refused, stored nowhere, counted
    with _collector(db, *off, "--report-max-mib", "0.01") as url:
        assert _reports(url)["stored"]["count"] == 0  # each report is larger than 10 KiB
        r = _post(url)
        assert r.status_code == 507
        assert (
            "more than all reports may (10.2 KiB, --report-max-mib 0.01): not stored"
            in r.json()["error"]["message"]
        )
        health = _reports(url)
        assert health["too_large"] == 1 and health["stored"]["count"] == 0


def test_bad_parameters_do_not_spend_the_manual_rate(tmp_path):
    args = ("--report-schedule", "off", "--report-burst", "1", "--report-rate-per-min", "0.01")
    with _collector(tmp_path / "rate.duckdb", *args) as url:
        for _ in range(5):
            assert _post(url, since="nope").status_code == 400
        assert _post(url).status_code == 200  # the one token was still there
        assert _post(url).status_code == 429


def test_report_with_a_token_needs_it_and_is_rate_limited_behind_it(tmp_path):
    args = ("--report-schedule", "off", "--control-token", "tok-9", "--report-burst", "1")
    with _collector(tmp_path / "tok.duckdb", *args) as url:
        assert _post(url).status_code == 401  # without the token: refused before the rate is spent
        auth = {"Authorization": "Bearer tok-9"}
        first = httpx.post(f"{url}/api/v1/reports", json={"since": "1h"}, headers=auth, timeout=120)
        assert first.status_code == 200
        second = httpx.post(f"{url}/api/v1/reports", json={"since": "1h"}, headers=auth, timeout=120)
        assert second.status_code == 429 and _reports(url)["manual_rate"]["refused"] == 1


@pytest.mark.parametrize(
    ("flag", "value", "says"),
    [
        ("--report-max-count", "0", "--report-max-count must be in [1, 10000000] reports, got 0"),
        ("--report-max-mib", "nan", "--report-max-mib must be in [0.01, 1048576] MiB, got nan"),
        ("--report-burst", "0", "--report-burst must be in [1, 1000] reports, got 0"),
        ("--report-rate-per-min", "inf", "--report-rate-per-min must be in [0.001, 600] reports a minute"),
    ],
)
def test_collect_refuses_bad_report_bounds(tmp_path, capsys, flag, value, says):
    assert main(["collect", "--db", str(tmp_path / "x.duckdb"), f"{flag}={value}"]) == 2
    assert says in capsys.readouterr().err
    assert not (tmp_path / "x.duckdb").exists()


def test_token_bucket_spends_a_burst_then_refills_at_its_rate():
    now = [100.0]
    bucket = TokenBucket(burst=2, per_s=0.5, clock=lambda: now[0])
    assert bucket.take() == 0 and bucket.take() == 0
    assert bucket.take() == pytest.approx(2.0)  # one token every 2 s
    now[0] += 1.0
    assert bucket.take() == pytest.approx(1.0)
    now[0] += 1.0
    assert bucket.take() == 0
    bucket.give_back()
    assert bucket.take() == 0
    now[0] += 1_000
    assert [bucket.take() for _ in range(3)][:2] == [0, 0]  # never more than the burst
