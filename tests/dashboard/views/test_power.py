"""The Power page end to end in AppTest: a real emulated stack (1 prefill + 1 decode emulated H200s
modeling 70B), a real collector watching it with a control token, calibrations made by the simulator's
sweep of the same GPU and model (tests/power_data.py: the live sweep is tests/phaselens/power's) —
the decode one with the stack's own fingerprint, the prefill one with an older engine — and a power
recommendation from each. The page draws the curves with the cliff, lists the setpoints per mode,
marks the prefill calibration stale (checked against the stack now, by the API) and does not offer
its recommendation; Apply… shows the dry-run plan, Execute sets the decode clock behind the guard,
and the page shows the guard's windows and realised tokens/J and latency before and after. The report
made afterwards on the store carries the realised saving."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from collector.store import Store
from dashboard.api import TOKEN_ENV
from phaselens.apply.stack import StackClient
from phaselens.power.run import read_stack
from phaselens.testing import start_collector
from serving.loadgen import run_load
from serving.sim.live_compare import serve_args_emulated
from serving.testing import TOKEN, Server, start_server, stop_server
from serving.trace import poisson_trace
from tests.conftest import stop_process
from tests.dashboard.views.conftest import figures_of, open_page, texts
from tests.power_data import calibration, recommendation

pytestmark = pytest.mark.slow  # a live stack: its workers run the emulated model


@pytest.fixture(scope="module")
def stack() -> Iterator[Server]:
    server = start_server(*serve_args_emulated(disaggregated=True))
    yield server
    stop_server(server)


@pytest.fixture(scope="module")
def service(stack: Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict]]:
    target = f"stack:{stack.url}"
    with StackClient(stack.url, TOKEN) as c:
        seen = read_stack(c, None)
    workers = {role: [w for w, _b in entries] for role, entries in seen["roles"].items()}
    decode = calibration(target, "decode", workers=workers["decode"], fp=seen["fingerprints"]["decode"])
    old = seen["fingerprints"]["prefill"]
    prefill = calibration(
        target,
        "prefill",
        workers=workers["prefill"],
        fp=type(old)(*(old.gpu_model, old.driver, old.model, old.dtype, old.tp, "phaselens 0.0.0")),
    )
    good = recommendation(target, {"decode": decode})
    # a loose SLO: this test checks the page and the flow, not the emulated latency on a loaded host
    good["details"]["inputs"]["slo"] = {"ttft_s": 30.0, "tpot_s": 5.0, "target": 0.5}
    stale = recommendation(target, {"prefill": prefill})
    stale["ts_s"] = good["ts_s"] - 60
    db = tmp_path_factory.mktemp("power-page") / "p.duckdb"
    with Store.open(db) as store:
        store.append("power_calibrations", [decode, prefill])
        store.append("recommendations", [good, stale])
        store.flush()
    proc, url = start_collector(
        db, "--serving", stack.url, "--control-token", TOKEN, "--report-schedule", "off"
    )
    yield url, {"good": good, "stale": stale, "decode": decode, "prefill": prefill, "workers": workers}
    stop_process(proc)
    with stack.control() as c:
        for w in c.get("/control/layout").json()["workers"]:
            c.post(f"/control/workers/{w['id']}/device", json={"reset": True})


def test_the_api_checks_the_calibrations_against_the_running_stack(service) -> None:
    url, _made = service
    cals = {
        c["role"]: c for c in httpx.get(f"{url}/api/v1/power/calibrations", timeout=30).json()["calibrations"]
    }
    assert cals["decode"]["usable"] is True and cals["decode"]["stack_check"]["checked"] is True
    assert cals["prefill"]["stale"] is True and cals["prefill"]["usable"] is False
    assert "engine_version 'phaselens 0.0.0' →" in cals["prefill"]["stale_reason"]
    assert cals["prefill"]["status"] == "current"  # read-only: the store is not marked by a read


def test_the_page_draws_offers_applies_and_shows_before_after(service, stack: Server, monkeypatch) -> None:
    url, made = service
    good, stale = made["good"], made["stale"]
    monkeypatch.setenv("PHASELENS_API_URL", url)
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    at = open_page("power")
    assert not at.exception, at.exception
    figs = figures_of(at)
    titles = [f["layout"]["title"]["text"] for f in figs]
    assert sorted(titles) == sorted(
        f"{r} ({r}) — {k}: tokens/J and latency"
        for r in ("prefill", "decode")
        for k in ("power limit", "SM-clock window")
    )
    clock = next(
        f
        for f in figs
        if f["layout"]["title"]["text"].startswith("decode") and "SM-clock" in f["layout"]["title"]["text"]
    )
    cliff = made["decode"]["cliff"]["sm_clock"]["setting"]["label"]
    assert any(cliff in (a.get("text") or "") for a in clock["layout"]["annotations"])
    said = texts(at).replace("\\:", ":")
    assert "Figures on this page: :blue-badge[simulated]" in said  # the page's one trust block
    setpoints = next(df.value for df in at.dataframe if "Mode" in df.value.columns)
    decode_rows = setpoints[setpoints["Role"] == "decode"]
    assert list(decode_rows["Mode"]) == ["PERF", "BAL", "EFF"] and (decode_rows["Status"] == "current").all()
    assert setpoints[setpoints["Role"] == "prefill"]["Status"].str.startswith("STALE").all()
    assert "Stale: the stack changed since it was calibrated" in said

    at.selectbox(key="power_pick").set_value(stale["recommendation_id"]).run()
    assert any("Made from a stale calibration: not offered" in e.value for e in at.error)
    assert not [b for b in at.button if b.key == "power_apply_plan"]

    # steady traffic from before the apply to after it (the windows before and after the change
    # both need tokens), in short traces until the apply has finished
    done = threading.Event()

    def traffic() -> None:
        seed = 0
        while not done.is_set():
            run_load(
                stack.url,
                poisson_trace(4.0, 8, prompt_tokens=(32, 128), output_tokens=16, seed=seed),
                progress=False,
            )
            seed += 1

    load = threading.Thread(target=traffic, daemon=True)
    load.start()
    started = time.monotonic()
    at.selectbox(key="power_pick").set_value(good["recommendation_id"]).run()
    at.button(key="power_apply_plan").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    setting = good["proposed"]["settings"]["decode"]["setting"]["label"]
    decode_worker = made["workers"]["decode"][0]
    assert f"set {decode_worker} (decode) to {setting}" in at.code[0].value
    time.sleep(max(0.0, 4.0 - (time.monotonic() - started)))  # a guard window of traffic before it
    at.number_input(key="power_guard_s").set_value(2.0)
    at.button(key="power_apply_execute").click().run()
    assert not at.exception and not at.error, [e.value for e in at.error]
    rid = good["recommendation_id"]
    deadline = time.monotonic() + 120
    while httpx.get(f"{url}/api/v1/recommendations/{rid}", timeout=30).json()["status"] != "applied":
        assert time.monotonic() < deadline, "the apply did not finish in 120 s"
        at.run()
        assert not at.exception
        time.sleep(0.5)
    time.sleep(3.0)  # traffic after the change, then stop it
    done.set()
    load.join(timeout=60)
    at.run()
    said = texts(at)
    assert "**Realised tokens/J and latency, before and after** (emulated" in said
    realised = next(df.value for df in at.dataframe if "Before" in df.value.columns)
    got = realised.set_index("Figure")
    assert got.loc["decode tokens/J (output tokens)", "Before"] != "—"
    assert got.loc["decode tokens/J (output tokens)", "After"] != "—"
    assert got.loc["TTFT p50, ms", "Before"] != "—" and got.loc["ITL p50, ms", "After"] != "—"
    guard = next(df.value for df in at.dataframe if "Event" in df.value.columns)
    assert "guard window passed" in list(guard["Event"])
    history = next(df.value for df in at.dataframe if "Actor" in df.value.columns)
    assert {"apply", "set_device", "guard", "realised"} <= set(history["Action"])
    assert at.button(key="power_rollback_ask") is not None

    # the report made now (through the service) carries the realised saving, labelled
    made_report = httpx.post(
        f"{url}/api/v1/reports",
        json={"since": "1h"},
        headers={"Authorization": f"Bearer {TOKEN}"},
        timeout=300,
    )
    assert made_report.status_code == 200, made_report.text
    got = httpx.get(f"{url}{made_report.json()['url']}", params={"format": "json"}, timeout=60).json()
    energy = got["summary"]["energy"]
    (real,) = energy["realised"]
    assert real["recommendation_id"] == rid and real["trust"][0] == "emulated"
    assert real["annual_trust"] == ["estimated"] and real["window_s"] >= 1
    decode = real["phases"]["decode"]
    assert decode["j_per_token_before"] > 0 and decode["j_per_token_after"] > 0
    assert decode["tokens_per_j_change_pct"] == pytest.approx(
        (decode["j_per_token_before"] / decode["j_per_token_after"] - 1) * 100
    )
    assert real["kwh_per_year"] is not None and real["usd_per_year"] is not None
    assert energy["per_phase"]["trust"][0] == "emulated"
