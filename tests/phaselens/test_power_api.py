"""GET /api/v1/power/calibrations (phaselens/power_api.py) on a real collector over a real store:
the rows newest first with each mode's setting and annual saving (as the power recommendation
computes it), the confidence, stale ones marked and never usable, the filters, bad parameters
refused naming them; read-only (the store's rows are unchanged). The check against a running
stack's fingerprint is tested with a live stack in tests/dashboard/views/test_power.py."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest

from analytics.prices import load_prices
from collector.store import Store
from phaselens.power.records import annual_saving
from phaselens.testing import start_collector
from tests.conftest import stop_process
from tests.power_data import calibration, fingerprint

TARGET = "stack:http://127.0.0.1:9"  # a stack this collector does not watch: not checked live


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, dict]]]:
    db = tmp_path_factory.mktemp("power-api") / "p.duckdb"
    decode = calibration(TARGET, "decode", workers=["worker-1", "worker-2"])
    prefill = calibration(TARGET, "prefill", workers=["worker-0"], fp=fingerprint(engine="old"))
    prefill["status"] = "stale"  # as usable_calibrations marks one whose fingerprint no longer matches
    prefill["ts_s"] = decode["ts_s"] - 10
    with Store.open(db) as store:
        store.append("power_calibrations", [prefill, decode])
        store.flush()
    proc, url = start_collector(db, "--report-schedule", "off")
    yield url, {"decode": decode, "prefill": prefill}
    stop_process(proc)


def test_the_calibrations_with_their_modes_savings_and_staleness(service) -> None:
    url, rows = service
    got = httpx.get(f"{url}/api/v1/power/calibrations", timeout=30)
    assert got.status_code == 200, got.text
    body = got.json()
    cals = body["calibrations"]
    assert [c["calibration_id"] for c in cals] == [
        rows["decode"]["calibration_id"],
        rows["prefill"]["calibration_id"],
    ]
    decode, prefill = cals
    assert decode["points"] == rows["decode"]["points"] and decode["cliff"] == rows["decode"]["cliff"]
    assert decode["usable"] is True and decode["stale"] is False
    assert (
        decode["stack_check"]["checked"] is False
        and "not a stack this collector watches" in decode["stack_check"]["text"]
    )
    prices = load_prices()
    assert body["prices"] == {"electricity_usd_per_kwh": prices.electricity_usd_per_kwh, "pue": prices.pue}
    for mode, m in rows["decode"]["details"]["choice"]["modes"].items():
        a = decode["annual_by_mode"][mode]
        assert a["gpus"] == 2 and a["setting"] == m["setting"]["label"]
        if m["keep_defaults"]:
            assert a["kwh_per_year"] == 0.0
        else:
            assert a | annual_saving(m["power_w_change"], 2, prices) == a  # as the recommendation computes it
            assert a["kwh_per_year"] > 0  # a lower clock draws less power
    assert decode["confidence"]["level"] == "low" and "simulated" in decode["confidence"]["text"]
    assert (
        prefill["stale"] is True and prefill["usable"] is False and "marked stale" in prefill["stale_reason"]
    )


def test_filters_one_row_and_refusals(service) -> None:
    url, rows = service
    with httpx.Client(base_url=url, timeout=30) as c:
        stale = c.get("/api/v1/power/calibrations", params={"status": "stale"}).json()["calibrations"]
        assert [r["role"] for r in stale] == ["prefill"]
        assert [
            r["role"]
            for r in c.get("/api/v1/power/calibrations", params={"role": "decode"}).json()["calibrations"]
        ] == ["decode"]
        assert (
            c.get("/api/v1/power/calibrations", params={"target": "stack:other"}).json()["calibrations"] == []
        )
        one = c.get(f"/api/v1/power/calibrations/{rows['decode']['calibration_id']}")
        assert one.status_code == 200 and one.json()["annual_by_mode"]["bal"]["gpus"] == 2
        for params, param in (
            ({"status": "old"}, "status"),
            ({"role": "gpu"}, "role"),
            ({"limit": 0}, "limit"),
        ):
            bad = c.get("/api/v1/power/calibrations", params=params)
            assert bad.status_code == 400 and bad.json()["error"]["param"] == param, bad.text
        assert (
            "must be one of current, stale, incomplete"
            in c.get("/api/v1/power/calibrations", params={"status": "old"}).json()["error"]["message"]
        )
        missing = c.get("/api/v1/power/calibrations/cal-nope")
        assert missing.status_code == 404 and "cal-nope" in missing.json()["error"]["message"]
        again = c.get("/api/v1/power/calibrations").json()["calibrations"]
        assert [r["status"] for r in again] == ["current", "stale"]  # read-only: nothing was marked
