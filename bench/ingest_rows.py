"""The rows bench/ingest.py writes, built the way the collector's sources build them: ``GET /v1/devices``
polls of 8 emulated GPUs (as columns, as ``ServingDevicesSource`` makes them, and as the dicts it made
before), dcgm-exporter scrapes of an 8-GPU page through a real ``DcgmSource``, serving telemetry
batches as ``GET /v1/telemetry`` returns them, and plain synthetic samples for the references.
bench/exposition.py parses the same dcgm-exporter page (:func:`dcgm_page`)."""

from __future__ import annotations

import httpx
import numpy as np
import pyarrow as pa

from collector.captures import capture
from collector.sources.base import TABLE_GPU_SAMPLES, SourceResult
from collector.sources.dcgm import DcgmSource
from collector.sources.serving_stack import TABLE_TELEMETRY, add_device_columns
from collector.store.columns import RepeatedColumns
from collector.store.devices import STEADY_SAMPLE_COLUMNS
from serving.telemetry import SCHEMA, SCHEMA_VERSION

DEVICES = 8


def sample_batch(n: int, t0: float, rng: np.random.Generator) -> pa.Table:
    """``n`` synthetic 100 ms samples of 8 H100s (every metric filled, with the device attributes
    kind/uuid/name as a source delivers them), as an Arrow table."""
    i = np.arange(n)
    dev = i % DEVICES
    # What NVML reports: integer % for utilization, integer deg C, power in mW, clocks in MHz;
    # GPM activity metrics are full-precision doubles.
    return pa.table(
        {
            "node": pa.array(["node-a"] * n),
            "source": pa.array(["nvml"] * n),
            "ts_s": t0 + (i // DEVICES) * 0.1,
            "device": pa.array([f"cuda:{d}" for d in dev]),
            "kind": pa.array(["cuda"] * n),
            "index": dev.astype(np.int32),
            "uuid": pa.array([f"GPU-{d:04d}" for d in dev]),
            "name": pa.array(["NVIDIA H100 80GB HBM3"] * n),
            "emulated": np.zeros(n, dtype=bool),
            "gpu_util_pct": rng.integers(0, 101, n).astype(np.float64),
            "mem_util_pct": rng.integers(0, 101, n).astype(np.float64),
            "sm_active_pct": rng.uniform(0, 100, n),
            "sm_occupancy_pct": rng.uniform(0, 100, n),
            "tensor_active_pct": rng.uniform(0, 100, n),
            "dram_active_pct": rng.uniform(0, 100, n),
            "power_w": rng.integers(70_000, 700_000, n) / 1000.0,
            "energy_mj": (i * 50).astype(np.int64),
            "power_limit_w": np.full(n, 700.0),
            "sm_clock_mhz": rng.integers(345, 1980, n, dtype=np.int32),
            "mem_clock_mhz": np.full(n, 2619, dtype=np.int32),
            "temperature_c": rng.integers(30, 80, n).astype(np.float64),
            "mem_used_bytes": rng.integers(0, 80 << 30, n, dtype=np.int64),
            "mem_total_bytes": np.full(n, 80 << 30, dtype=np.int64),
            "clock_event_reasons": np.zeros(n, dtype=np.uint64),
            "lost": np.zeros(n, dtype=bool),
        }
    )


def device_polls(polls: int) -> list[list[dict]]:
    """``polls`` answers of ``GET /v1/devices`` (decoded JSON) of a stack with 8 emulated GPUs."""
    rows = sample_batch(polls * DEVICES, 1.7e9, np.random.default_rng(4)).drop_columns(["node", "source"])
    samples = rows.to_pylist()
    out = []
    for p in range(polls):
        items = []
        for d in range(DEVICES):
            sample = samples[p * DEVICES + d]
            sample["emulated"] = True
            items.append(
                {
                    "worker": f"worker-{d}",
                    "role": "decode",
                    "device": sample["device"],
                    "gpu_uuid": sample["uuid"],
                    "gpu_index": d,
                    "pid": 0,
                    "sample": sample,
                }
            )
        out.append(items)
    return out


def columns_results(polls: list[list[dict]]) -> list[SourceResult]:
    """What ``ServingDevicesSource`` makes of each poll: gpu_samples columns."""
    results = []
    repeats = RepeatedColumns(steady=STEADY_SAMPLE_COLUMNS)  # as ServingDevicesSource holds one
    for k, items in enumerate(polls):
        res = SourceResult("serving-devices:bench", 1.7e9 + k * 0.1)
        add_device_columns(res, items, "node-a", repeats)
        results.append(res)
    return results


def dict_results(polls: list[list[dict]]) -> list[SourceResult]:
    """The same polls as the source produced them before: one dict per sample."""
    results = []
    for k, items in enumerate(polls):
        res = SourceResult("serving-devices:bench", 1.7e9 + k * 0.1)
        res.add_rows(
            TABLE_GPU_SAMPLES,
            [
                {
                    **i["sample"],
                    "worker": i["worker"],
                    "role": i["role"],
                    "node": "node-a",
                    "source": "emulated",
                }
                for i in items
            ],
        )
        results.append(res)
    return results


def dcgm_page(gpus: int = DEVICES) -> str:
    """A dcgm-exporter page of ``gpus`` L4s: the real L4 scrape (collector/captures/), its GPU's series
    repeated per GPU with that GPU's labels (gpu, UUID, device, pci_bus_id)."""
    text = capture("dcgm-exporter-l4.prom")
    head = [line for line in text.splitlines() if line.startswith("#")]
    series = [line for line in text.splitlines() if line and not line.startswith("#")]
    out = list(head)
    for g in range(gpus):
        out += [
            line.replace('gpu="0"', f'gpu="{g}"')
            .replace("GPU-c2f76b33", f"GPU-{g:04d}b33")
            .replace('device="nvidia0"', f'device="nvidia{g}"')
            .replace("00000000:31:00.0", f"00000000:{0x31 + g:02x}:00.0")
            for line in series
        ]
    return "\n".join(out) + "\n"


def dcgm_results(scrapes: int) -> list[SourceResult]:
    """What a real ``DcgmSource`` makes of ``scrapes`` scrapes of an 8-GPU page, one a second,
    served over an in-process HTTP transport (every scrape's power readings differ, so no row is
    dropped as unchanged): the source's own fetch, parsing, mapping and de-duplication. The
    scrapes after a first one: what the source produces while it runs (the first counts the page's
    unmapped DCGM families, once an hour; replayed as a round of the bench, it made 250× the errors)."""
    page = dcgm_page()
    scrape = [0]

    def serve(request: httpx.Request) -> httpx.Response:
        power = f"{16.0 + scrape[0] * 0.001:.6f}"
        return httpx.Response(200, text=page.replace("16.365000", power))

    clock = [1.7e9]
    src = DcgmSource(
        "http://dcgm.bench:9400/metrics",
        node="node-a",
        client=httpx.Client(transport=httpx.MockTransport(serve)),
        clock=lambda: clock[0],
    )
    src.poll(force=True)  # the first scrape counts the page's unmapped families (once an hour)
    results = []
    for k in range(1, scrapes + 1):
        scrape[0], clock[0] = k, 1.7e9 + k
        results.append(src.poll(force=True))
    src.close()
    if sum(r.n_rows for r in results) != scrapes * DEVICES:
        raise SystemExit("dcgm: the source dropped rows of the bench's scrapes")
    return results


WORKER_BATCHES_PER_ROUTER_BATCH = 4
EVENTS_PER_BATCH = 512
TOKENS_PER_REQUEST = 128


def telemetry_events(rng: np.random.Generator) -> tuple[list[dict], list[dict]]:
    """One worker batch's iteration events and one router batch's request events (decoded JSON)."""
    t0 = 1.7e9
    iterations = [
        {
            "type": "iteration",
            "worker": "worker-1",
            "device": "emulated:h100-sxm",
            "gpu_uuid": "GPU-emulated-1",
            "gpu_index": 1,
            "start_s": t0 + i * 0.02,
            "end_s": t0 + i * 0.02 + 0.018,
            "phase": "decode",
            "batch_size": 32,
            "prefill_tokens": 0,
            "decode_seqs": 32,
            "context_tokens": int(rng.integers(4_000, 60_000)),
            "kv_blocks_used": int(rng.integers(100, 4000)),
            "kv_blocks_total": 4096,
            "preempted": 0,
            "compute_s": 0.011,
            "pacing_s": 0.007,
        }
        for i in range(EVENTS_PER_BATCH)
    ]
    requests = []
    for r in range(EVENTS_PER_BATCH):
        arrival = t0 + r * 0.05
        tokens = (arrival + 0.2 + np.cumsum(rng.uniform(0.015, 0.03, TOKENS_PER_REQUEST))).tolist()
        requests.append(
            {
                "type": "request",
                "request_id": f"cmpl-{r}",
                "arrival_s": arrival,
                "first_scheduled_s": arrival + 0.01,
                "prefill_start_s": arrival + 0.01,
                "prefill_end_s": arrival + 0.15,
                "kv_transfer_start_s": arrival + 0.15,
                "kv_transfer_end_s": arrival + 0.19,
                "kv_transfer_bytes": 4_194_304,
                "first_token_s": tokens[0],
                "token_ts_s": tokens,
                "finish_s": tokens[-1],
                "prompt_tokens": 1024,
                "output_tokens": TOKENS_PER_REQUEST,
                "prefill_worker": "worker-0",
                "decode_worker": "worker-1",
                "status": "ok",
                "finish_reason": "length",
                "attempts": 1,
                "preemptions": 0,
            }
        )
    return iterations, requests


def telemetry_results(groups: int, batches_per_poll: int = 1000) -> tuple[list[SourceResult], int]:
    """Polls of ``GET /v1/telemetry`` (at most 1000 batches each) as ``ServingTelemetrySource``
    hands them on, and the rows they make; every batch distinct (seq), events shared."""
    iterations, requests = telemetry_events(np.random.default_rng(5))
    batches = []
    for g in range(groups):
        for w in range(WORKER_BATCHES_PER_ROUTER_BATCH):
            seq = g * WORKER_BATCHES_PER_ROUTER_BATCH + w
            batches.append(_envelope("worker-1", seq, iterations))
        batches.append(_envelope("router", g, requests))
    results = []
    for k in range(0, len(batches), batches_per_poll):
        res = SourceResult("serving-telemetry:bench", 1.7e9 + k)
        res.add_rows(TABLE_TELEMETRY, batches[k : k + batches_per_poll])
        results.append(res)
    rows_per_group = (
        WORKER_BATCHES_PER_ROUTER_BATCH * (EVENTS_PER_BATCH + 1)
        + EVENTS_PER_BATCH * (1 + TOKENS_PER_REQUEST)
        + 1
    )
    return results, groups * rows_per_group


def _envelope(source: str, seq: int, events: list[dict]) -> dict:
    return {
        "schema": SCHEMA,
        "version": SCHEMA_VERSION,
        "source": source,
        "seq": seq,
        "sent_s": 1.7e9 + seq * 0.25,
        "dropped_events_total": 0,
        "events": events,
    }
