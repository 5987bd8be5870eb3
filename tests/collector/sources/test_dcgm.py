"""dcgm-exporter scrapes → gpu_samples rows, against a real local HTTP server serving a real L4 scrape."""

from __future__ import annotations

import re

import pytest

from collector.sources import TABLE_GPU_SAMPLES, Backoff, DcgmSource
from collector.sources.dcgm import GPU_ROW_COLUMNS, is_blank, rows_from_text
from serving.devices.base import DeviceSample
from tests.collector.sources.conftest import L4_PROM, FakeClock, LocalServer, closed_port_url

MIB = 1024 * 1024
L4_UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
L4_NODE = "i-030791dc5a37cd257"


def set_value(text: str, field: str, value: str) -> str:
    """Replace the value of every ``field{...}`` sample line."""
    new, n = re.subn(rf"^({field}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}", text, flags=re.M)
    assert n >= 1, field
    return new


def add_sample(text: str, field: str, value: str) -> str:
    """Append a ``field`` sample for the L4 GPU (a field the real scrape does not carry)."""
    labels = re.search(r"^DCGM_FI_DEV_SM_CLOCK(\{[^}]*\})", text, flags=re.M).group(1)
    return text + f"# TYPE {field} gauge\n{field}{labels} {value}\n"


def one_row(source: DcgmSource) -> dict:
    result = source.poll(force=True)
    assert result.ok, result.errors
    rows = result.rows[TABLE_GPU_SAMPLES]
    assert len(rows) == 1
    return rows[0]


@pytest.fixture
def dcgm(http_server: LocalServer, clock: FakeClock):
    made: list[DcgmSource] = []

    def make(body: str = L4_PROM, **kw) -> DcgmSource:
        url = http_server.serve_text("/metrics", body)
        made.append(DcgmSource(url, clock=clock, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


def test_real_l4_scrape_maps_onto_device_sample_columns(dcgm, http_server: LocalServer) -> None:
    src = dcgm()
    result = src.poll()
    assert result.ok and result.errors == [], result.errors
    (row,) = result.rows[TABLE_GPU_SAMPLES]
    # Values read from tests/collector/sources/data/dcgm-exporter-l4.prom.
    assert row["ts_s"] == 1_000.0
    assert row["node"] == L4_NODE  # the old `Hostname` label
    assert row["source"] == f"dcgm:{http_server.url}/metrics"
    assert (row["device"], row["index"], row["kind"], row["emulated"]) == ("cuda:0", 0, "cuda", False)
    assert row["name"] == "NVIDIA L4"
    assert row["uuid"] == L4_UUID
    assert row["sm_clock_mhz"] == 210 and isinstance(row["sm_clock_mhz"], int)
    assert row["mem_clock_mhz"] == 405
    assert row["temperature_c"] == 31.0
    assert row["power_w"] == pytest.approx(16.365)
    assert row["energy_mj"] == 4_742_776 and isinstance(row["energy_mj"], int)
    assert row["gpu_util_pct"] == 0.0
    assert row["mem_util_pct"] == 0.0
    assert row["tensor_active_pct"] == 0.0
    assert row["dram_active_pct"] == 0.0
    assert row["mem_used_bytes"] == 0
    assert row["mem_total_bytes"] == (0 + 22_563 + 470) * MIB  # used + free + reserved
    # Not in this scrape → NULL, never a made-up number.
    for col in ("sm_active_pct", "sm_occupancy_pct", "power_limit_w", "clock_event_reasons"):
        assert row[col] is None, col
    assert (row["k8s_pod"], row["k8s_namespace"], row["k8s_container"]) == (None, None, None)
    assert row["lost"] is False
    # Every DeviceSample field is a column of the row.
    assert {f for f in DeviceSample.__dataclass_fields__} <= set(row)
    assert tuple(row) == GPU_ROW_COLUMNS
    h = src.health()
    assert (h.status, h.rows_total, h.errors_total, h.consecutive_failures) == ("ok", 1, 0, 0)
    assert h.last_success_s == 1_000.0


def test_new_hostname_label_and_kubernetes_labels(dcgm) -> None:
    body = L4_PROM.replace('Hostname="i-030791dc5a37cd257"', 'hostname="gpu-node-7"')
    body = body.replace(
        'DCGM_FI_DRIVER_VERSION="580.105.08"}',
        'DCGM_FI_DRIVER_VERSION="580.105.08",container="vllm",namespace="llm",pod="vllm-decode-0"}',
    )
    row = one_row(dcgm(body))
    assert row["node"] == "gpu-node-7"
    assert (row["k8s_pod"], row["k8s_namespace"], row["k8s_container"]) == ("vllm-decode-0", "llm", "vllm")


def test_model_name_label_spelling_and_node_fallback_to_url_host(dcgm) -> None:
    body = L4_PROM.replace('modelName="NVIDIA L4"', 'model_name="NVIDIA L4"')
    body = body.replace(',Hostname="i-030791dc5a37cd257"', "")
    row = one_row(dcgm(body))
    assert row["name"] == "NVIDIA L4"
    assert row["node"] == "127.0.0.1"  # no hostname label: the endpoint's host


def test_blank_sentinels_become_null(dcgm) -> None:
    body = set_value(L4_PROM, "DCGM_FI_DEV_GPU_TEMP", "9223372036854775794")  # int64 blank
    body = set_value(body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "9.223372036854776e+18")
    body = set_value(body, "DCGM_FI_DEV_SM_CLOCK", "2147483632")  # int32 blank
    body = set_value(body, "DCGM_FI_DEV_POWER_USAGE", "140737488355328.000000")  # fp64 blank
    body = set_value(body, "DCGM_FI_DEV_FB_FREE", "9223372036854775792")
    src = dcgm(body)
    result = src.poll()
    row = result.rows[TABLE_GPU_SAMPLES][0]
    for col in ("temperature_c", "energy_mj", "sm_clock_mhz", "power_w", "mem_total_bytes"):
        assert row[col] is None, col
    assert row["mem_clock_mhz"] == 405  # the rest of the scrape is kept
    assert result.errors == []  # a blank is "no data", not a fault
    assert src.health().status == "ok"


def test_blank_rule_keeps_a_large_energy_counter() -> None:
    assert not is_blank("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 2_147_483_640)
    assert is_blank("DCGM_FI_DEV_SM_CLOCK", 2_147_483_640)
    assert is_blank("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 9.3e18)
    assert not is_blank("DCGM_FI_DEV_POWER_USAGE", 700.0)


def test_ratios_become_percent_and_newer_clock_event_name_wins(dcgm) -> None:
    body = add_sample(L4_PROM, "DCGM_FI_PROF_SM_ACTIVE", "0.5")
    body = add_sample(body, "DCGM_FI_PROF_SM_OCCUPANCY", "0.25")
    body = add_sample(body, "DCGM_FI_DEV_POWER_MGMT_LIMIT", "72.000000")
    body = add_sample(body, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "1")
    body = add_sample(body, "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "4")
    body = set_value(body, "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "0.125")
    body = set_value(body, "DCGM_FI_PROF_DRAM_ACTIVE", "0.8")
    body = set_value(body, "DCGM_FI_DEV_FB_USED", "1024")
    row = one_row(dcgm(body))
    assert row["sm_active_pct"] == pytest.approx(50.0)
    assert row["sm_occupancy_pct"] == pytest.approx(25.0)
    assert row["tensor_active_pct"] == pytest.approx(12.5)
    assert row["dram_active_pct"] == pytest.approx(80.0)
    assert row["power_limit_w"] == 72.0
    assert row["clock_event_reasons"] == 4
    assert row["mem_used_bytes"] == 1024 * MIB
    assert row["mem_total_bytes"] == (1024 + 22_563 + 470) * MIB


def test_old_clock_throttle_reasons_name_alone() -> None:
    body = add_sample(L4_PROM, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", "8")
    (row,) = rows_from_text(body).rows[TABLE_GPU_SAMPLES]
    assert row["clock_event_reasons"] == 8


def test_one_row_per_gpu(dcgm) -> None:
    lines = []
    for line in L4_PROM.splitlines():
        lines.append(line)
        if line.startswith("DCGM_FI_"):
            lines.append(line.replace('gpu="0"', 'gpu="1"').replace(L4_UUID, "GPU-second"))
    src = dcgm("\n".join(lines) + "\n")
    rows = src.poll().rows[TABLE_GPU_SAMPLES]
    assert sorted((r["device"], r["uuid"]) for r in rows) == [("cuda:0", L4_UUID), ("cuda:1", "GPU-second")]


def test_malformed_lines_and_non_numeric_values_are_counted_and_the_rest_kept(dcgm) -> None:
    body = set_value(L4_PROM, "DCGM_FI_DEV_GPU_UTIL", "N/A")
    body = body.replace(
        "# HELP DCGM_FI_DEV_POWER_USAGE",
        'DCGM_FI_DEV_SM_CLOCK{gpu="0",UUID="broken 77\nthis line is not an exposition line {{{\n'
        "# HELP DCGM_FI_DEV_POWER_USAGE",
    )
    body += "some_other_exporter_metric 5\n"
    src = dcgm(body)
    result = src.poll()
    assert result.ok
    assert result.error_count("non_numeric") == 1
    assert result.error_count("malformed_line") == 2
    assert result.error_count("unknown_metric") == 1
    assert all(e.source == src.name for e in result.errors)
    (row,) = result.rows[TABLE_GPU_SAMPLES]
    assert row["gpu_util_pct"] is None  # its line was dropped
    assert row["power_w"] == pytest.approx(16.365)
    assert row["sm_clock_mhz"] == 210
    h = src.health()
    assert h.status == "degraded"  # data was dropped
    assert h.errors_total == 4
    assert "non_numeric" in h.last_error or "malformed_line" in h.last_error


def test_clock_going_backwards_is_counted_and_dropped(dcgm, clock: FakeClock) -> None:
    src = dcgm()
    assert len(src.poll().rows[TABLE_GPU_SAMPLES]) == 1
    clock.t -= 30  # the host clock jumped back
    result = src.poll(force=True)
    assert result.ok and result.rows.get(TABLE_GPU_SAMPLES, []) == []
    assert result.error_count("clock_backwards") == 1
    assert src.health().status == "degraded"
    clock.t += 60
    result = src.poll(force=True)
    assert len(result.rows[TABLE_GPU_SAMPLES]) == 1 and result.errors == []
    assert src.health().status == "ok"


def test_explicit_sample_timestamps_are_used_and_checked(dcgm, http_server: LocalServer) -> None:
    stamped = "\n".join(
        (line + " 1700000000000") if line.startswith("DCGM_FI_") else line for line in L4_PROM.splitlines()
    )
    src = dcgm(stamped + "\n")
    assert one_row(src)["ts_s"] == 1_700_000_000.0
    http_server.serve_text("/metrics", stamped.replace(" 1700000000000", " 1699999999000") + "\n")
    result = src.poll(force=True)
    assert result.error_count("clock_backwards") == 1 and result.rows.get(TABLE_GPU_SAMPLES, []) == []


def test_unreachable_endpoint_is_down_and_backs_off(clock: FakeClock) -> None:
    backoff = Backoff(base_s=1.0, max_s=8.0, jitter=0.1, rng=lambda: 0.5)
    src = DcgmSource(closed_port_url(), clock=clock, backoff=backoff, timeout_s=2.0)
    assert src.health().status == "unknown"
    delays = []
    for _ in range(5):
        result = src.poll()
        assert not result.ok and not result.skipped
        assert result.errors[0].kind == "unreachable" and result.errors[0].source == src.name
        h = src.health()
        assert h.status == "down"
        delays.append(h.next_attempt_s - clock.t)
        # Not due yet: polling again fetches nothing and changes nothing.
        again = src.poll()
        assert again.skipped and src.health().consecutive_failures == h.consecutive_failures
        clock.t = h.next_attempt_s
    assert delays == [1.0, 2.0, 4.0, 8.0, 8.0]
    h = src.health()
    assert (h.consecutive_failures, h.errors_total, h.last_success_s) == (5, 5, None)
    assert h.last_error.startswith("unreachable")
    assert src.available() is False


def test_recovers_after_http_errors(http_server: LocalServer, clock: FakeClock) -> None:
    url = http_server.serve_text("/metrics", "exporter starting", status=503)
    src = DcgmSource(url, clock=clock, backoff=Backoff(base_s=5.0, jitter=0.0))
    result = src.poll()
    assert result.errors[0].kind == "http_status" and "503" in result.errors[0].message
    assert src.health().status == "down"
    http_server.serve_text("/metrics", L4_PROM)
    assert src.poll().skipped  # still backing off
    clock.advance(5.0)
    result = src.poll()
    assert result.ok and len(result.rows[TABLE_GPU_SAMPLES]) == 1
    h = src.health()
    assert (h.status, h.consecutive_failures, h.last_success_s) == ("ok", 0, clock.t)
    assert src.backoff.failures == 0


def test_available_is_cached(dcgm, http_server: LocalServer, clock: FakeClock) -> None:
    src = dcgm(discovery_ttl_s=60.0)
    assert src.available() is True
    assert src.available() is True
    assert http_server.hits["/metrics"] == 1
    clock.advance(61)
    assert src.available() is True
    assert http_server.hits["/metrics"] == 2
    not_dcgm = DcgmSource(http_server.serve_text("/other", "up 1\n"), clock=clock)
    assert not_dcgm.available() is False


def test_many_gives_one_source_per_endpoint(http_server: LocalServer, clock: FakeClock) -> None:
    a = http_server.serve_text("/a", L4_PROM)
    b = http_server.serve_text("/b", L4_PROM.replace(L4_NODE, "node-b"))
    sources = DcgmSource.many([a, b, closed_port_url()], clock=clock)
    results = [s.poll() for s in sources]
    assert [r.ok for r in results] == [True, True, False]
    assert [r.rows[TABLE_GPU_SAMPLES][0]["node"] for r in results[:2]] == [L4_NODE, "node-b"]
    assert [s.health().status for s in sources] == ["ok", "ok", "down"]
    for s in sources:
        s.close()
