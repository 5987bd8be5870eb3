"""dcgm-exporter scrapes → gpu_samples rows, against a real local HTTP server serving a real L4 scrape."""

from __future__ import annotations

import re
import socket
from pathlib import Path

import pytest

from collector.sources import TABLE_GPU_SAMPLES, Backoff, DcgmSource
from collector.sources.dcgm import GPU_ROW_COLUMNS, is_blank, rows_from_text
from collector.store import Store
from serving.devices.base import DeviceSample
from tests.collector.sources.conftest import DATA, L4_PROM, FakeClock, LocalServer, closed_port_url

MIB = 1024 * 1024
L4_UUID = "GPU-c2f76b33-7953-256e-8f33-1343419b1a1c"
L4_NODE = "i-030791dc5a37cd257"
HOST = socket.gethostname()
# The DCGM fields of the real L4 scrape that gpu_samples has no column for (counted, not dropped).
L4_UNMAPPED = {
    "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "DCGM_FI_DEV_ENC_UTIL",
    "DCGM_FI_DEV_DEC_UTIL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
    "DCGM_FI_DEV_ROW_REMAP_FAILURE",
    "DCGM_FI_DEV_VGPU_LICENSE_STATUS",
}
A30_MIG_PROM = (DATA / "dcgm-exporter-a30-mig.prom").read_text()
A30_UUID = "GPU-5d4e2a1b-8c3f-4e6a-9b2d-7f1c0e3a6b58"


def unmapped(result) -> set[str]:
    """The families counted as unmapped on a poll result (each a warning of its own)."""
    found = [e for e in result.errors if e.kind == "unmapped"]
    assert all(e.severity == "warning" and e.count == 1 for e in found)
    return {e.message.split(":")[0] for e in found}


def not_unmapped(result) -> list:
    return [e for e in result.errors if e.kind != "unmapped"]


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
    rows = result.table_rows(TABLE_GPU_SAMPLES)
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
    assert result.ok and not_unmapped(result) == [], result.errors
    assert unmapped(result) == L4_UNMAPPED
    (row,) = result.table_rows(TABLE_GPU_SAMPLES)
    # Values read from collector/captures/dcgm-exporter-l4.prom.
    assert row["ts_s"] == 1_000.0
    assert row["node"] == HOST  # the collector's node (the default: this host) ...
    assert row["exporter_hostname"] == L4_NODE  # ... and the exporter's old `Hostname` label apart
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
    assert row["gr_engine_active_pct"] == 0.0
    assert (row["pcie_tx_bytes_per_s"], row["pcie_rx_bytes_per_s"]) == (112_603.0, 17_544.0)
    assert row["mem_used_bytes"] == 0
    assert row["mem_total_bytes"] == (0 + 22_563 + 470) * MIB  # used + free + reserved
    # Not in this scrape → NULL, never a made-up number.
    for col in ("sm_active_pct", "sm_occupancy_pct", "power_limit_w", "clock_event_reasons"):
        assert row[col] is None, col
    assert (row["k8s_pod"], row["k8s_namespace"], row["k8s_container"]) == (None, None, None)
    assert (row["mig_instance_id"], row["mig_profile"], row["parent_uuid"]) == (None, None, None)
    assert row["lost"] is False
    # Every DeviceSample field is a column of the row.
    assert {f for f in DeviceSample.__dataclass_fields__} <= set(row)
    assert sorted(row) == sorted(GPU_ROW_COLUMNS)  # every column (handed on as columns: order not kept)
    h = src.health()
    # unmapped families are warnings: counted, the source stays ok
    assert (h.status, h.rows_total, h.errors_total, h.consecutive_failures) == ("ok", 1, 8, 0)
    assert h.last_success_s == 1_000.0


def test_new_hostname_label_and_kubernetes_labels(dcgm) -> None:
    body = L4_PROM.replace('Hostname="i-030791dc5a37cd257"', 'hostname="gpu-node-7"')
    body = body.replace(
        'DCGM_FI_DRIVER_VERSION="580.105.08"}',
        'DCGM_FI_DRIVER_VERSION="580.105.08",container="vllm",namespace="llm",pod="vllm-decode-0"}',
    )
    row = one_row(dcgm(body, node="collector-1"))
    assert (row["node"], row["exporter_hostname"]) == ("collector-1", "gpu-node-7")
    assert (row["k8s_pod"], row["k8s_namespace"], row["k8s_container"]) == ("vllm-decode-0", "llm", "vllm")


def test_model_name_label_spelling_and_no_hostname_label(dcgm) -> None:
    body = L4_PROM.replace('modelName="NVIDIA L4"', 'model_name="NVIDIA L4"')
    body = body.replace(',Hostname="i-030791dc5a37cd257"', "")
    row = one_row(dcgm(body))
    assert row["name"] == "NVIDIA L4"
    assert (row["node"], row["exporter_hostname"]) == (HOST, None)


def test_blank_sentinels_become_null(dcgm) -> None:
    body = set_value(L4_PROM, "DCGM_FI_DEV_GPU_TEMP", "9223372036854775794")  # int64 blank
    body = set_value(body, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "9.223372036854776e+18")
    body = set_value(body, "DCGM_FI_DEV_SM_CLOCK", "2147483632")  # int32 blank
    body = set_value(body, "DCGM_FI_DEV_POWER_USAGE", "140737488355328.000000")  # fp64 blank
    body = set_value(body, "DCGM_FI_DEV_FB_FREE", "9223372036854775792")
    src = dcgm(body)
    result = src.poll()
    row = result.table_rows(TABLE_GPU_SAMPLES)[0]
    for col in ("temperature_c", "energy_mj", "sm_clock_mhz", "power_w", "mem_total_bytes"):
        assert row[col] is None, col
    assert row["mem_clock_mhz"] == 405  # the rest of the scrape is kept
    assert not_unmapped(result) == []  # a blank is "no data", not a fault
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
    (row,) = rows_from_text(body).table_rows(TABLE_GPU_SAMPLES)
    assert row["clock_event_reasons"] == 8


def test_one_row_per_gpu(dcgm) -> None:
    lines = []
    for line in L4_PROM.splitlines():
        lines.append(line)
        if line.startswith("DCGM_FI_"):
            lines.append(line.replace('gpu="0"', 'gpu="1"').replace(L4_UUID, "GPU-second"))
    src = dcgm("\n".join(lines) + "\n")
    rows = src.poll().table_rows(TABLE_GPU_SAMPLES)
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
    assert unmapped(result) == L4_UNMAPPED | {"some_other_exporter_metric"}
    assert all(e.source == src.name for e in result.errors)
    (row,) = result.table_rows(TABLE_GPU_SAMPLES)
    assert row["gpu_util_pct"] is None  # its line was dropped
    assert row["power_w"] == pytest.approx(16.365)
    assert row["sm_clock_mhz"] == 210
    h = src.health()
    assert h.status == "degraded"  # data was dropped
    assert h.errors_total == 1 + 2 + 9
    assert "non_numeric" in h.last_error or "malformed_line" in h.last_error


def test_clock_going_backwards_is_counted_and_dropped(
    dcgm, clock: FakeClock, http_server: LocalServer
) -> None:
    src = dcgm()
    assert len(src.poll().table_rows(TABLE_GPU_SAMPLES)) == 1
    clock.t -= 30  # the host clock jumped back
    result = src.poll(force=True)
    assert result.ok and result.table_rows(TABLE_GPU_SAMPLES) == []
    assert result.error_count("clock_backwards") == 1
    assert src.health().status == "degraded"
    clock.t += 60
    http_server.serve_text("/metrics", set_value(L4_PROM, "DCGM_FI_DEV_POWER_USAGE", "17.0"))
    result = src.poll(force=True)
    assert len(result.table_rows(TABLE_GPU_SAMPLES)) == 1 and result.errors == []  # unmapped: once an hour
    assert src.health().status == "ok"


def test_explicit_sample_timestamps_are_used_and_checked(dcgm, http_server: LocalServer) -> None:
    stamped = "\n".join(
        (line + " 1700000000000") if line.startswith("DCGM_FI_") else line for line in L4_PROM.splitlines()
    )
    src = dcgm(stamped + "\n")
    assert one_row(src)["ts_s"] == 1_700_000_000.0
    http_server.serve_text("/metrics", stamped.replace(" 1700000000000", " 1699999999000") + "\n")
    result = src.poll(force=True)
    assert result.error_count("clock_backwards") == 1 and result.table_rows(TABLE_GPU_SAMPLES) == []


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
    assert result.ok and len(result.table_rows(TABLE_GPU_SAMPLES)) == 1
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
    rows = [r.table_rows(TABLE_GPU_SAMPLES)[0] for r in results[:2]]
    assert [r["exporter_hostname"] for r in rows] == [L4_NODE, "node-b"]
    assert [r["node"] for r in rows] == [HOST, HOST]
    assert [s.health().status for s in sources] == ["ok", "ok", "down"]
    for s in sources:
        s.close()


def test_unchanged_exporter_values_are_stored_once_and_counted(
    dcgm, http_server: LocalServer, clock: FakeClock
) -> None:
    src = dcgm(interval_s=1.0)
    assert len(src.poll().table_rows(TABLE_GPU_SAMPLES)) == 1
    for _ in range(5):  # dcgm-exporter refreshes every 30 s by default: the same values again
        clock.advance(1.0)
        result = src.poll()
        assert result.ok and result.table_rows(TABLE_GPU_SAMPLES) == [] and result.errors == []
    assert src.health_details()["unchanged_scrapes"] == 5
    assert src.health_details()["unchanged_rows"] == 5
    h = src.health()
    assert (h.status, h.rows_total, h.errors_total) == ("ok", 1, len(L4_UNMAPPED))  # not errors
    clock.advance(1.0)
    http_server.serve_text("/metrics", set_value(L4_PROM, "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "4742999"))
    (row,) = src.poll().table_rows(TABLE_GPU_SAMPLES)
    assert (row["ts_s"], row["energy_mj"]) == (1_006.0, 4_742_999)


def test_exporter_timestamps_decide_what_is_new(dcgm, http_server: LocalServer, clock: FakeClock) -> None:
    def stamped(text: str, ms: int) -> str:
        lines = [(ln + f" {ms}") if ln.startswith("DCGM_FI_") else ln for ln in text.splitlines()]
        return "\n".join(lines) + "\n"

    src = dcgm(stamped(L4_PROM, 1_700_000_000_000))
    assert one_row(src)["ts_s"] == 1_700_000_000.0
    clock.advance(1.0)
    # Same exporter timestamp (even with other values, e.g. a half-refreshed page): not a new sample.
    http_server.serve_text(
        "/metrics", stamped(set_value(L4_PROM, "DCGM_FI_DEV_POWER_USAGE", "20"), 1_700_000_000_000)
    )
    result = src.poll(force=True)
    assert result.table_rows(TABLE_GPU_SAMPLES) == [] and not_unmapped(result) == []
    assert src.health_details()["unchanged_scrapes"] == 1
    # A newer exporter timestamp is a new sample even when no value moved.
    http_server.serve_text("/metrics", stamped(L4_PROM, 1_700_000_030_000))
    clock.advance(1.0)
    assert one_row(src)["ts_s"] == 1_700_000_030.0


def test_unmapped_families_are_counted_once_per_hour(
    dcgm, http_server: LocalServer, clock: FakeClock
) -> None:
    src = dcgm()
    assert unmapped(src.poll()) == L4_UNMAPPED
    for step in range(1, 4):
        clock.advance(600.0)
        http_server.serve_text("/metrics", set_value(L4_PROM, "DCGM_FI_DEV_POWER_USAGE", str(20 + step)))
        result = src.poll()
        assert result.table_rows(TABLE_GPU_SAMPLES) and unmapped(result) == set()
    clock.advance(1_800.0)  # an hour after the first count
    http_server.serve_text("/metrics", L4_PROM)
    assert unmapped(src.poll()) == L4_UNMAPPED
    assert src.health_details()["unmapped_families"] == len(L4_UNMAPPED)


def mig_rows(text: str = A30_MIG_PROM) -> dict[str, dict]:
    result = rows_from_text(text, node="n1", ts_s=5.0)
    assert not_unmapped(result) == [], result.errors
    return {r["device"]: r for r in result.table_rows(TABLE_GPU_SAMPLES)}


def test_mig_instances_are_devices_of_their_own_and_gpu_power_is_stored_once() -> None:
    rows = mig_rows()
    assert sorted(rows) == ["cuda:0", "cuda:0/gi1", "cuda:0/gi5", "cuda:0/gi6"]
    whole = rows["cuda:0"]
    assert (whole["uuid"], whole["index"], whole["name"]) == (A30_UUID, 0, "NVIDIA A30")
    assert (whole["mig_instance_id"], whole["mig_profile"], whole["parent_uuid"]) == (None, None, None)
    # GPU-level fields once, on the whole-GPU row (the exporter repeats them on every instance)
    assert whole["power_w"] == pytest.approx(70.37)
    assert whole["energy_mj"] == 912_837_465
    assert (whole["sm_clock_mhz"], whole["temperature_c"], whole["mem_util_pct"]) == (1440, 41.0, 12.0)
    assert whole["pcie_rx_bytes_per_s"] == 18_234_511.0
    assert whole["gr_engine_active_pct"] is None  # no whole-GPU series for it in this exporter's output
    gi1 = rows["cuda:0/gi1"]
    assert (gi1["mig_instance_id"], gi1["mig_profile"], gi1["parent_uuid"]) == (1, "2g.12gb", A30_UUID)
    assert (gi1["uuid"], gi1["index"]) == (None, 0)  # DCGM does not export the MIG UUID
    assert gi1["gr_engine_active_pct"] == pytest.approx(81.2345)  # the MIG utilization NVIDIA recommends
    assert gi1["tensor_active_pct"] == pytest.approx(30.1122)
    assert gi1["mem_used_bytes"] == 10_412 * MIB and gi1["mem_total_bytes"] == (10_412 + 1_303) * MIB
    assert (gi1["k8s_pod"], gi1["k8s_namespace"]) == ("vllm-decode-0", "llm")
    for r in (rows["cuda:0/gi1"], rows["cuda:0/gi5"], rows["cuda:0/gi6"]):
        for col in (
            "power_w",
            "energy_mj",
            "sm_clock_mhz",
            "temperature_c",
            "pcie_tx_bytes_per_s",
            "gpu_util_pct",
        ):
            assert r[col] is None, (r["device"], col)
    assert rows["cuda:0/gi5"]["mig_profile"] == "1g.6gb"
    assert rows["cuda:0/gi6"]["gr_engine_active_pct"] == 0.0


def test_sum_of_power_per_physical_gpu_in_the_store_is_the_gpus_power(tmp_path: Path) -> None:
    result = rows_from_text(A30_MIG_PROM, source="dcgm:a30", node="n1", ts_s=5.0)
    with Store.open(tmp_path / "s.duckdb") as store:
        store.append("gpu_samples", result.table_rows(TABLE_GPU_SAMPLES))
        store.flush()
        per_gpu = store.query(
            "SELECT coalesce(parent_uuid, uuid) AS gpu, sum(power_w) AS w, sum(energy_mj) AS mj, "
            "count(*) AS n, count(mig_instance_id) AS instances FROM gpu_samples_full GROUP BY 1"
        ).to_dict("records")
        profiles = store.query(
            "SELECT coalesce(mig_profile, 'whole GPU') AS p, count(*) AS n FROM devices GROUP BY 1 ORDER BY 1"
        )
    assert len(per_gpu) == 1
    g = per_gpu[0]
    assert (g["gpu"], g["n"], g["instances"]) == (A30_UUID, 4, 3)
    assert g["w"] == pytest.approx(70.37)  # not 3 x 70.37 = 211 W
    assert g["mj"] == 912_837_465
    assert dict(zip(profiles["p"].tolist(), profiles["n"].tolist(), strict=True)) == {
        "1g.6gb": 2,
        "2g.12gb": 1,
        "whole GPU": 1,
    }


def test_older_mig_exposition_with_whole_gpu_series() -> None:
    """dcgm-exporter 2.x writes whole-GPU series (no GPU_I_* labels) beside the instances' series."""
    labels = f'gpu="0",UUID="{A30_UUID}",device="nvidia0",modelName="NVIDIA A30",Hostname="old-exporter"'
    whole = (
        f"DCGM_FI_DEV_POWER_USAGE{{{labels}}} 99.500000\n"
        f"DCGM_FI_PROF_GR_ENGINE_ACTIVE{{{labels}}} 0.600000\n"
        f"DCGM_FI_DEV_FB_USED{{{labels}}} 11401\n"
    )
    rows = mig_rows(whole + A30_MIG_PROM)
    assert sorted(rows) == ["cuda:0", "cuda:0/gi1", "cuda:0/gi5", "cuda:0/gi6"]
    assert rows["cuda:0"]["power_w"] == 99.5  # the whole GPU's own series wins over the instances' copies
    assert rows["cuda:0"]["gr_engine_active_pct"] == pytest.approx(60.0)
    assert rows["cuda:0"]["mem_used_bytes"] == 11_401 * MIB
    assert rows["cuda:0"]["sm_clock_mhz"] == 1440  # only on the instances' series: taken from them once
    assert sum(r["power_w"] or 0 for r in rows.values()) == 99.5


@pytest.mark.parametrize("page", [L4_PROM, A30_MIG_PROM], ids=["l4", "a30-mig"])
def test_scrapes_hand_their_metrics_on_packed_and_store_what_their_rows_store(
    dcgm, http_server: LocalServer, clock: FakeClock, tmp_path: Path, page: str
) -> None:
    src = dcgm(page, node="node-a")
    results = []
    for power in ("16.5", "17.25", "18.0"):
        http_server.serve_text("/metrics", set_value(page, "DCGM_FI_DEV_POWER_USAGE", power))
        results.append(src.poll(force=True))
        clock.advance(1.0)
    blocks = [b for r in results for b in r.columns[TABLE_GPU_SAMPLES]]
    assert len(blocks) == 3 and all(b.floats is not None for b in blocks)  # blank fields: NaN
    with Store.open(tmp_path / "packed.duckdb") as store:
        store.append_columns(TABLE_GPU_SAMPLES, blocks)
        store.flush()
        packed = store.query("SELECT * FROM gpu_samples_full ORDER BY ts_s, device")
    with Store.open(tmp_path / "rows.duckdb") as store:
        store.append(TABLE_GPU_SAMPLES, [row for r in results for row in r.table_rows(TABLE_GPU_SAMPLES)])
        store.flush()
        assert packed.equals(store.query("SELECT * FROM gpu_samples_full ORDER BY ts_s, device"))
    assert packed["power_w"].dropna().tolist()[-1] == 18.0 and packed["power_w"].isna().any() == (
        page is A30_MIG_PROM  # MIG instance rows carry no power of their own
    )
