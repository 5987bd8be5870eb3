"""``phaselens simulate``: run deployments in virtual time and store them as labelled scenarios.

The simulator (:mod:`serving.sim`) knows nothing of DuckDB; this module stores what it produced,
through the store's own ingest code: its telemetry batches go through
``Store.append_telemetry_batches`` exactly as a live stack's do, and its device samples through
``Store.append`` as a sampler's would. Every row of a scenario has ``node = 'sim:<scenario_id>'``
(telemetry producers keep their ``worker-N``/``router`` sources; GPU samples have ``source =
'simulated'``, ``kind = 'simulated'`` and ``emulated = TRUE``) and the ``scenarios`` table
describes the run, so simulated rows are never mistaken for measured ones.

Where the rows go respects the single writer: ``--db FILE`` writes the file directly (refused, with
the way out, while a collector holds it); ``--collector URL`` writes a Parquet export and asks that
collector to merge it (``POST /api/v1/import``, a control call: ``--token``); ``--out DIR`` only
writes the Parquet export (``phaselens store import DIR`` merges it later).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from serving.trace import TraceRequest

if TYPE_CHECKING:
    import pyarrow as pa


def new_scenario_id() -> str:
    return time.strftime("%Y%m%dT%H%M%S", time.gmtime()) + "-" + uuid.uuid4().hex[:6]


# rows a simulated run's store holds before it writes them on a background flush (DuckDB's work
# then overlaps the simulation's; two buffers at most: ~50 MB)
WRITE_BUFFER_ROWS = 500_000


class ScenarioWriter:
    """Stores one simulated run as a scenario while it runs: pass :meth:`on_batch` to the
    :class:`~serving.sim.simulator.Simulation` (its telemetry batches go through the store's live
    ingest path as they come, so a fleet's hour never sits in memory), then :meth:`finish` with the
    result (each GPU's devices row and samples every ``sample_period_s``, the scenario row).
    ``seconds`` is the wall time spent storing."""

    def __init__(self, store: Any, scenario_id: str, *, batches_per_write: int = 32) -> None:
        self.store = store
        self.scenario_id = scenario_id
        from collector.store.scenarios import scenario_node  # the store loads only when a run is stored

        self.node = scenario_node(scenario_id)
        self.counts: dict[str, int] = {"iterations": 0, "requests": 0, "tokens": 0, "control_events": 0}
        self.seconds = 0.0
        self._buffer: list[dict[str, Any]] = []
        self._per_write = batches_per_write

    def on_batch(self, batch: Any) -> None:
        """Take one telemetry batch (an envelope, or from a columnar ``Simulation`` a worker's
        ``IterationBatch`` or the router's ``TokenTimesBatch``); every ``batches_per_write`` go to the store together."""
        self._buffer.append(batch)
        if len(self._buffer) >= self._per_write:
            self._write_batches()

    def _write_batches(self) -> None:
        if not self._buffer:
            return
        t = time.perf_counter()
        batches, self._buffer = self._buffer, []
        ingests = self.store.append_telemetry_batches(
            batches, self.node, received_s=_sent_s(batches[-1]), endpoint="simulator"
        )
        for key in ("iterations", "requests", "tokens", "control_events"):
            self.counts[key] += sum(getattr(i, key) for i in ingests)
        rejected = sum(i.rejected_events for i in ingests)
        self.seconds += time.perf_counter() - t
        if rejected:  # the simulator's own events must fit the contract: a bug, said loudly
            raise RuntimeError(
                f"the store rejected {rejected} simulated telemetry events (see ingest_errors)"
            )

    def finish(
        self,
        result: Any,
        *,
        sample_period_s: float = 0.1,
        summary: dict[str, Any] | None = None,
        trace: dict[str, Any] | None = None,
        name: str | None = None,
    ) -> dict[str, int]:
        """Write what is left: pending batches, each GPU's devices row and samples, the scenario.
        Returns the rows written per table."""
        import pyarrow as pa

        from analytics.jsonable import json_safe
        from collector.store.scenarios import SIMULATED
        from serving.devices.gpu_model import weight_bytes
        from serving.sim.samples import replica_samples

        self._write_batches()
        t = time.perf_counter()
        store, node, counts = self.store, self.node, self.counts
        shape = result.shape
        spec_key = result.layout.gpu
        # Each GPU's owner from the first instant, so every iteration joins to its GPU's role; the
        # samples' attributes equal these, so they add no devices rows of their own.
        owners = [
            {
                "node": node,
                "source": SIMULATED,
                "device": f"simulated:{spec_key}",
                "index": g.index,
                "since_s": result.start_s,
                "kind": "simulated",
                "uuid": g.uuid,
                "name": f"{result.gpu_name} (simulated)",
                "emulated": True,
                "worker": replica.id,
                "role": replica.role,
            }
            for replica in result.replicas
            for g in replica.gpus
        ]
        counts["devices"] = store.append("devices", owners)
        # every GPU's samples in one append, in GPU order (one Arrow table: the store converts,
        # checks and inserts it once, not once per GPU)
        shared: dict[Any, Any] = {}
        tables = [
            _sample_table(cols, node, spec_key, result.gpu_name, shared)
            for replica in result.replicas
            for cols in replica_samples(
                result, replica, sample_period_s, weight_bytes(shape, replica.pool.tp, result.layout.dtype)
            )
        ]
        counts["gpu_samples"] = store.append("gpu_samples", pa.concat_tables(tables)) if tables else 0
        row = {
            "scenario_id": self.scenario_id,
            "node": node,
            "created_s": time.time(),
            "label": SIMULATED,
            "name": name or result.layout.name,
            "model": shape.name,
            "gpu": result.gpu_name,
            "layout": result.layout.describe(),
            "trace": trace or {},
            "params": {"sample_period_s": sample_period_s},
            "start_s": result.start_s,
            "end_s": result.end_s,
            "wall_s": result.wall_s,
            "summary": json_safe(summary or {}),
        }
        counts["scenarios"] = store.append("scenarios", [row])
        store.flush()
        self.seconds += time.perf_counter() - t
        return dict(counts)


def store_simulation(
    store: Any,
    result: Any,
    *,
    scenario_id: str,
    sample_period_s: float = 0.1,
    summary: dict[str, Any] | None = None,
    trace: dict[str, Any] | None = None,
    name: str | None = None,
) -> dict[str, int]:
    """Write a finished run that kept its batches (``Simulation`` without ``on_batch``) as a
    scenario; return the rows written per table."""
    writer = ScenarioWriter(store, scenario_id)
    for batch in result.batches:
        writer.on_batch(batch)
    return writer.finish(result, sample_period_s=sample_period_s, summary=summary, trace=trace, name=name)


def _sent_s(batch: Any) -> float:
    from serving.telemetry_columns import TokenTimesBatch  # with the store (numpy): only when storing

    if type(batch) is TokenTimesBatch:
        batch = batch.batch
    return batch["sent_s"] if isinstance(batch, dict) else batch.sent_s


def _sample_table(
    cols: Any, node: str, spec_key: str, gpu_name: str, cache: dict[Any, Any] | None = None
) -> pa.Table:
    """One GPU's samples as the ``gpu_samples`` Arrow table, its attribute columns repeated.

    ``cache`` (one per run's write) keeps what GPUs share: the Arrow columns of a replica's
    samples (its ranks yield one ``columns`` dict) and each repeated string column."""
    import numpy as np
    import pyarrow as pa

    from collector.store.scenarios import SIMULATED

    cache = {} if cache is None else cache
    n = cols.n
    key = id(cols.columns)
    hit = cache.get(key)
    if hit is None or hit[0] is not cols.columns:
        data: dict[str, Any] = {}
        for name, values in cols.columns.items():
            if isinstance(values, np.ndarray):
                data[name] = pa.array(values)
            elif values and values[0] is None and values.count(None) == len(values):
                data[name] = pa.nulls(len(values), pa.int32())
            else:
                data[name] = pa.array(values, type=pa.int32())
        flags = (pa.array(np.ones(n, dtype=bool)), pa.array(np.zeros(n, dtype=bool)))
        cache[key] = hit = (cols.columns, data, flags)
    data = dict(hit[1])

    def same(value: str | None) -> pa.Array:  # one value on every row: its bytes n times
        arr = cache.get((value, n))
        if arr is None and value is None:
            arr = pa.nulls(n, pa.string())
        elif arr is None:
            raw = value.encode()
            if n * len(raw) < 2**31:  # a string array's 32-bit offsets
                offsets = np.arange(n + 1, dtype=np.int64) * len(raw)
                buffers = pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(raw * n)
                arr = pa.StringArray.from_buffers(n, *buffers)
            else:
                arr = pa.repeat(pa.scalar(value, pa.string()), n)
            cache[(value, n)] = arr
        return arr

    data.update(
        node=same(node),
        source=same(SIMULATED),
        device=same(f"simulated:{spec_key}"),
        kind=same("simulated"),
        index=pa.array(np.full(n, cols.index, dtype=np.int32)),
        uuid=same(cols.uuid),
        name=same(f"{gpu_name} (simulated)"),
        emulated=hit[2][0],
        lost=hit[2][1],
        worker=same(cols.worker),
        role=same(cols.role),
    )
    return pa.table(data)


# -- stored traffic as a trace ----------------------------------------------------------------------


def requests_from_rows(rows: Sequence[dict[str, Any]]) -> list[TraceRequest]:
    """Stored request rows (``requests`` table) as a trace, arrivals relative to the first one.

    Failed requests are kept (they were offered load); a row without token counts is skipped.
    """
    usable = [
        r
        for r in rows
        if r.get("arrival_s") is not None
        and (r.get("prompt_tokens") or 0) > 0
        and (r.get("output_tokens") or 0) > 0
    ]
    if not usable:
        return []
    t0 = min(r["arrival_s"] for r in usable)
    out = [
        TraceRequest(r["arrival_s"] - t0, int(r["prompt_tokens"]), int(r["output_tokens"])) for r in usable
    ]
    out.sort(key=lambda r: r.arrival_s)
    return out


def load_stored_requests(
    *, db: str | None, url: str | None, since_s: float, until_s: float | None = None, node: str | None = None
) -> list[TraceRequest]:
    """The requests that arrived in ``[since_s, until_s)`` from a store file or a collector's API.

    A file held by a running collector cannot be opened (DuckDB's lock): pass its ``url`` then.
    Simulated scenarios (``node`` ``sim:*``) are never taken as traffic unless ``node`` names one.
    """
    until = until_s if until_s is not None else time.time() + 1
    if url:
        import httpx

        rows: list[dict[str, Any]] = []
        start = since_s
        while True:
            params: dict[str, Any] = {"start": start, "end": until, "limit": 100_000}
            if node:
                params["node"] = node
            resp = httpx.get(url.rstrip("/") + "/api/v1/tables/requests", params=params, timeout=60)
            if resp.status_code != 200:
                raise ValueError(
                    f"{url}: GET /api/v1/tables/requests answered {resp.status_code}: {resp.text[:300]}"
                )
            body = resp.json()
            page = body["rows"]
            rows.extend(page)
            if not body.get("truncated") or not page:
                break
            start = max(r["arrival_s"] for r in page) + 1e-6
    else:
        from collector.store import Store

        with Store.open(db or "phaselens.duckdb", read_only=True) as store:
            where = "arrival_s >= ? AND arrival_s < ?"
            params_l: list[Any] = [since_s, until]
            if node:
                where += " AND node = ?"
                params_l.append(node)
            df = store.query(
                f"SELECT node, arrival_s, prompt_tokens, output_tokens FROM requests WHERE {where}", params_l
            )
            rows = df.to_dict("records")
    if not node:
        rows = [r for r in rows if not str(r.get("node", "")).startswith("sim:")]
    return requests_from_rows(rows)


# -- the command ------------------------------------------------------------------------------------


def add_simulate_command(sub: Any) -> None:
    """Register ``phaselens simulate`` on the CLI's subparsers."""
    from serving.loadgen import add_trace_arguments

    p = sub.add_parser(
        "simulate",
        help="run deployments in virtual time (fleets, layouts not deployed) and store them as scenarios",
        description=(
            "Simulate serving a trace on one or more layouts in virtual time with the GPU model "
            "(no GPU, no sleeping) and print a comparison table. Every figure is simulated."
        ),
    )
    p.add_argument(
        "--layout",
        action="append",
        required=True,
        metavar="LAYOUT",
        help="e.g. agg:8xh100-sxm:tp2 or 3p1d:h100-sxm:tp2:decode.power_limit_w=450 (repeat to compare)",
    )
    p.add_argument("--model", default="llama-3.1-8b", help="model shape: a preset name or an HF folder")
    add_trace_arguments(p)
    p.add_argument(
        "--from-store",
        metavar="SINCE",
        default=None,
        help="replay the requests stored in the last SINCE (e.g. 1h, 30m, 3600s) instead of a trace",
    )
    p.add_argument("--from-node", default=None, help="with --from-store: only this node's requests")
    p.add_argument("--sample-period-s", type=float, default=0.1, help="device sample period (0.1)")
    p.add_argument("--slo-ttft-ms", type=float, default=2000.0, help="TTFT SLO for attainment (2000)")
    p.add_argument("--slo-tpot-ms", type=float, default=100.0, help="TPOT SLO for attainment (100)")
    p.add_argument(
        "--start-s", type=float, default=None, help="UTC epoch s of virtual time 0 (default: ends now)"
    )
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--db", default=None, help="write the scenarios into this store file (default phaselens.duckdb)"
    )
    where.add_argument(
        "--collector", default=None, metavar="URL", help="merge the scenarios through this collector"
    )
    where.add_argument("--out", default=None, metavar="DIR", help="only write a Parquet export to DIR")
    where.add_argument("--no-store", action="store_true", help="print the table only")
    p.add_argument(
        "--token", default=None, help="the collector's control token (or env PHASELENS_CONTROL_TOKEN)"
    )
    p.add_argument("--json-out", default=None, metavar="PATH", help="write the summaries as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_simulate)


def _error(message: str) -> int:
    print(f"phaselens simulate: error: {message}", file=sys.stderr)
    return 2


def cmd_simulate(args: argparse.Namespace) -> int:
    """Run ``phaselens simulate``; 2 on bad input (said before anything runs), else 0."""
    from analytics.window import AnalyticsError, parse_span_s
    from serving.config import ConfigError, model_config_for
    from serving.loadgen import build_trace, trace_option_error
    from serving.sim.layout import parse_layout
    from serving.sim.simulator import SimulationError
    from serving.sim.summary import slo_ms_error

    try:
        message = trace_option_error(args)
        if message:
            raise ValueError(message)
        if args.from_store and (args.trace or args.poisson):
            raise ValueError("--from-store replays stored requests; it does not go with --trace or --poisson")
        layouts = [parse_layout(text) for text in args.layout]
        shape = model_config_for(args.model)
        if not 0.01 <= args.sample_period_s <= 60:
            raise ValueError(f"--sample-period-s must be in [0.01, 60], got {args.sample_period_s:g}")
        for option, value in (("--slo-ttft-ms", args.slo_ttft_ms), ("--slo-tpot-ms", args.slo_tpot_ms)):
            if (message := slo_ms_error(option, value)) is not None:
                raise ValueError(message)
        if args.from_store:
            try:
                span = parse_span_s(args.from_store)
            except AnalyticsError as e:
                raise ValueError(f"--from-store: {e}") from None
            now = time.time()
            requests = load_stored_requests(
                db=args.db if not args.collector else None,
                url=args.collector,
                since_s=now - span,
                node=args.from_node,
            )
            trace_desc = {"kind": "stored", "since_s": now - span, "until_s": now, "node": args.from_node}
            if not requests:
                raise ValueError(f"no stored requests in the last {args.from_store} (nothing to replay)")
        else:
            requests, _, desc = build_trace(args)
            trace_desc = {"kind": "trace", "description": desc, "requests": len(requests)}
            if not requests:
                raise ValueError(f"{desc}: the trace has no requests in the chosen window")
    except (ConfigError, SimulationError, ValueError, OSError) as e:
        return _error(str(e))
    from serving.sim.layout import check_layout

    try:
        for layout in layouts:
            check_layout(layout, shape)
    except (ConfigError, ValueError) as e:
        return _error(str(e))
    return _run(args, layouts, shape, requests, trace_desc)


def _run(
    args: argparse.Namespace, layouts: list[Any], shape: Any, requests: list[TraceRequest], trace: dict
) -> int:
    from serving.sim.simulator import Simulation, virtual_start_s
    from serving.sim.summary import SloSpec, format_table, summarize

    start_s = args.start_s if args.start_s is not None else virtual_start_s(requests)
    slo = SloSpec(ttft_s=args.slo_ttft_ms / 1000.0, tpot_s=args.slo_tpot_ms / 1000.0)
    sink = _open_sink(args)
    if isinstance(sink, int):
        return sink
    from collector.client import CollectorImportError
    from collector.store import StoreError

    summaries = []
    stored: list[tuple[str, dict[str, int]]] = []
    try:
        for layout in layouts:
            sid = new_scenario_id()
            writer = ScenarioWriter(sink.store, sid) if sink is not None else None
            bar = _Bar(layout.name, not args.no_progress)
            result = Simulation(
                layout,
                shape,
                requests,
                start_s=start_s,
                scenario=sid,
                progress=bar.update,
                on_batch=writer.on_batch if writer is not None else _drop,
                columnar=True,
            ).run()
            bar.close()
            summary = summarize(result, slo)
            summaries.append(summary)
            if writer is not None:
                counts = writer.finish(
                    result, sample_period_s=args.sample_period_s, summary=summary.to_dict(), trace=trace
                )
                stored.append((sid, counts))
        if sink is not None:
            sink.finish()
    except (CollectorImportError, StoreError, OSError) as e:
        print(format_table(summaries))
        print(
            f"phaselens simulate: error: storing the scenarios failed, nothing was stored: {e}",
            file=sys.stderr,
        )
        return 1
    finally:
        if sink is not None:
            sink.close()
    print(format_table(summaries))
    for sid, counts in stored:
        rows = sum(counts.values())
        print(
            f"scenario {sid}: {rows:,} rows ({counts.get('gpu_samples', 0):,} GPU samples) {sink.where} "
            f"as node sim:{sid}, labelled simulated"
        )
    if stored and sink.analyze_from:  # `phaselens analyze` alone reads the live data, not a scenario
        print("analyze a scenario (phaselens analyze without --dataset reads the live data, not these):")
        for sid, _counts in stored:
            print(f"  phaselens analyze {sink.analyze_from} --dataset {sid}")
    if args.json_out:
        from analytics.jsonable import json_safe

        Path(args.json_out).write_text(json.dumps([json_safe(s.to_dict()) for s in summaries], indent=1))
    return 0


def _drop(batch: dict[str, Any]) -> None:
    """Telemetry of a run that is not stored (``--no-store``): the summary needs none of it."""


class _Bar:
    def __init__(self, label: str, enabled: bool) -> None:
        self._bar = None
        if enabled and sys.stderr.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=100, desc=f"simulating {label}", unit="%", leave=False, file=sys.stderr)
        self._last = 0

    def update(self, done_s: float, total_s: float) -> None:
        if self._bar is None or total_s <= 0:
            return
        pct = int(100 * done_s / total_s)
        if pct > self._last:
            self._bar.update(pct - self._last)
            self._last = pct

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class _Sink:
    """Where scenarios are written: a store file directly, or a Parquet export (merged later or now)."""

    def __init__(
        self,
        store: Any,
        where: str,
        finish: Callable[[], None],
        close: Callable[[], None],
        analyze_from: str | None = None,
    ) -> None:
        self.store, self.where = store, where
        self._finish, self._close = finish, close
        self.analyze_from = analyze_from  # where `phaselens analyze` reads the scenarios (its options)

    def finish(self) -> None:
        self._finish()

    def close(self) -> None:
        self._close()


def _open_sink(args: argparse.Namespace) -> _Sink | int | None:
    from collector.store import Store, StoreError, StoreLockedError

    if args.no_store:
        return None
    if args.out or args.collector:
        token = args.token or os.environ.get("PHASELENS_CONTROL_TOKEN")
        if args.collector and not token:
            return _error(
                "--collector needs the collector's control token: --token T or PHASELENS_CONTROL_TOKEN"
            )
        tmp = tempfile.TemporaryDirectory(prefix="phaselens-sim-")
        store = Store.open(Path(tmp.name) / "scenario.duckdb", buffer_rows=WRITE_BUFFER_ROWS)
        out_dir = Path(args.out) if args.out else Path(tmp.name) / "export"

        def finish() -> None:
            from collector.store import export_parquet

            store.flush()
            export_parquet(store, out_dir)
            if args.collector:
                _post_import(args.collector, token, out_dir)

        def close() -> None:
            store.close()
            tmp.cleanup()

        where = f"exported to {out_dir}" if args.out else f"merged through {args.collector}"
        return _Sink(store, where, finish, close, None if args.out else f"--collector {args.collector}")
    db = args.db or "phaselens.duckdb"
    try:
        store = Store.open(db, buffer_rows=WRITE_BUFFER_ROWS)
    except StoreLockedError as e:
        return _error(
            f"{e}. A running collector holds {db}: pass --collector http://127.0.0.1:PORT (its --port; 8900 "
            "by default) --token T to merge the scenarios through it, or --out DIR to write a Parquet export"
        )
    except StoreError as e:
        return _error(str(e))
    return _Sink(store, f"written to {db}", lambda: None, store.close, f"--db {db}")


def _post_import(url: str, token: str, out_dir: Path) -> None:
    from collector.client import import_into_collector

    import_into_collector(url, out_dir, token=token)
