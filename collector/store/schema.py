"""The store's schema, as numbered migrations applied in order.

Conventions (every table):

* **Time** is UTC epoch seconds in a ``DOUBLE`` column whose name ends in ``_s`` (``ts_s``,
  ``start_s``, ``arrival_s``, ``bucket_start_s`` ...). This is the unit the serving telemetry
  contract and :class:`serving.devices.base.DeviceSample` already use, so ingest copies values
  unchanged, and intervals are plain subtraction (``first_token_s - arrival_s`` is TTFT in seconds).
  A double holds epoch seconds to well under a microsecond. ``to_timestamp(ts_s)`` gives a
  ``TIMESTAMPTZ`` where a calendar is wanted. Durations are ``*_s`` too.
* **Units in names**: ``_pct`` (0-100), ``_w``, ``_mj`` (millijoules), ``_mhz``, ``_c``, ``_bytes``,
  ``_tokens``, ``_seqs``. Columns copied from the telemetry contract keep its names
  (``batch_size`` counts sequences, ``preempted`` counts sequences, ``attempts`` counts tries).
* **NULL** means "not measured / not supported" -- never a string such as ``'N/A'``.
* **node** on every data table: the machine (collector) the row describes or came from. It is the
  second Parquet partition key and part of every natural key, so exports of many nodes merge.
* JSON-valued fields (control before/after, labels, details) are ``JSON`` columns.
* **Token timestamps** live in their own ``tokens`` table (``node, request_id, idx, ts_s, itl_s``),
  not in a LIST column of ``requests``: ITL percentiles are then a plain aggregate over a column
  (``quantile_cont(itl_s, 0.99)``) with no UNNEST, tokens join to ``iterations`` and
  ``gpu_samples`` by time range, and the ``requests`` rows stay narrow. ``itl_s`` (gap to the
  request's previous token, NULL for the first) is computed at ingest.
* **Device attributes** (``kind``, ``uuid``, ``name``, Kubernetes labels) are not repeated on every
  sample: ``devices`` holds one row per GPU (node, source, device, index) each time they are first
  seen or change, valid from ``since_s``; ``gpu_samples_full`` / ``gpu_samples_10s_full`` join them
  back (ASOF by time). ``index`` and ``emulated`` stay on every sample row.
* No indexes or primary keys on the high-rate tables: they would slow batched appends several
  times; natural keys (``collector.store.tables``) are enforced when merging Parquet imports.

The DDL of migrations 1-4 (the base tables) is in collector/store/base_ddl.py. Each migration runs in one transaction together with its ``schema_version`` row. Never edit a
released migration; add a new one.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

import duckdb

from collector.store import iteration_seconds
from collector.store.base_ddl import V1_SAMPLES, V2_TELEMETRY, V3_ENGINE_METRICS, V4_ANALYTICS
from collector.store.errors import StoreError


@dataclass(frozen=True, slots=True)
class Migration:
    """One schema step: applied once, in version order."""

    version: int
    description: str
    sql: str


# The ledger of applied migrations; created by the migration runner before the first step.
SCHEMA_VERSION_DDL = """
CREATE TABLE IF NOT EXISTS schema_version (
    version      INTEGER PRIMARY KEY,
    description  VARCHAR NOT NULL,
    applied_at_s DOUBLE  NOT NULL
);
"""


# Metrics rolled up as avg_* and max_* per 10 s bucket by migration 5 (a released migration's input:
# never edit; later metrics go in ROLLUP_AVG_MAX_METRICS below, with their own migration).
_V5_ROLLUP_METRICS: tuple[str, ...] = (
    "gpu_util_pct",
    "mem_util_pct",
    "sm_active_pct",
    "sm_occupancy_pct",
    "tensor_active_pct",
    "dram_active_pct",
    "power_w",
    "power_limit_w",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "temperature_c",
    "mem_used_bytes",
)
# Metrics added to gpu_samples by migration 7 (DOUBLE avg_* and max_* in gpu_samples_10s).
_V7_SAMPLE_METRICS: tuple[str, ...] = ("gr_engine_active_pct", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s")
# Every metric rolled up as avg_* and max_* per 10 s bucket (see collector.store.retention).
ROLLUP_AVG_MAX_METRICS: tuple[str, ...] = (*_V5_ROLLUP_METRICS, *_V7_SAMPLE_METRICS, "host_bound_pct")


def _rollup_ddl() -> str:
    metric_cols = ",\n".join(
        f"    avg_{m} DOUBLE,\n    max_{m} {'DOUBLE' if m.endswith(('_pct', '_w', '_c')) else 'BIGINT'}"
        for m in _V5_ROLLUP_METRICS
    )
    return f"""
-- 10 s rollup of gpu_samples; kept far longer than the raw rows. avg_* are means over the
-- samples in the bucket that had the metric; min/max_energy_mj bracket the energy counter.
CREATE TABLE gpu_samples_10s (
    node                    VARCHAR NOT NULL,
    source                  VARCHAR NOT NULL,
    device                  VARCHAR NOT NULL,
    bucket_start_s          DOUBLE  NOT NULL,
    kind                    VARCHAR,
    "index"                 INTEGER,
    uuid                    VARCHAR,
    name                    VARCHAR,
    emulated                BOOLEAN NOT NULL,
    samples                 BIGINT  NOT NULL,
    lost_samples            BIGINT  NOT NULL,
{metric_cols},
    min_energy_mj           BIGINT,
    max_energy_mj           BIGINT,
    max_mem_total_bytes     BIGINT,
    any_clock_event_reasons UBIGINT,
    min_locked_sm_clock_min_mhz INTEGER,
    max_locked_sm_clock_max_mhz INTEGER,
    k8s_pod                 VARCHAR,
    k8s_namespace           VARCHAR,
    k8s_container           VARCHAR
);
"""


# Device attributes that are constant per GPU (or change rarely: a Kubernetes pod moves) leave the
# sample rows: ``devices`` holds one row each time a GPU's attributes are first seen or change, from
# ``since_s`` on, and the ``*_full`` views join them back by time (ASOF) for readers of the old shape.
_V6_DEVICES = """
CREATE TABLE devices (
    node          VARCHAR NOT NULL,
    source        VARCHAR NOT NULL,
    device        VARCHAR NOT NULL,
    "index"       INTEGER,
    since_s       DOUBLE  NOT NULL,            -- ts of the first sample with these attributes
    kind          VARCHAR,                     -- cuda | emulated | cpu
    uuid          VARCHAR,
    name          VARCHAR,
    emulated      BOOLEAN NOT NULL,
    k8s_pod       VARCHAR,                     -- dcgm-exporter pod attribution
    k8s_namespace VARCHAR,
    k8s_container VARCHAR
);

-- Backfill: per GPU (node, source, device, index) and attribute set, the first and last time seen
-- in the raw samples and the rollups. A GPU whose attribute sets interleave in time (pod A, then B,
-- then A again) is rescanned sample by sample so that every change gets its own row.
CREATE TEMP VIEW _v6_seen AS
SELECT node, source, device, "index", ts_s AS at_s, kind, uuid, name, emulated,
       k8s_pod, k8s_namespace, k8s_container
FROM gpu_samples
UNION ALL
SELECT node, source, device, "index", bucket_start_s, kind, uuid, name, emulated,
       k8s_pod, k8s_namespace, k8s_container
FROM gpu_samples_10s;

CREATE TEMP TABLE _v6_spans AS
SELECT node, source, device, "index", kind, uuid, name, emulated, k8s_pod, k8s_namespace, k8s_container,
       min(at_s) AS since_s, max(at_s) AS until_s
FROM _v6_seen
GROUP BY ALL;

CREATE TEMP TABLE _v6_interleaved AS
SELECT DISTINCT a.node, a.source, a.device, a."index"
FROM _v6_spans a JOIN _v6_spans b
  ON a.node = b.node AND a.source = b.source AND a.device = b.device
 AND a."index" IS NOT DISTINCT FROM b."index"
 AND a.rowid <> b.rowid AND a.since_s <= b.since_s AND b.since_s <= a.until_s;

INSERT INTO devices
SELECT node, source, device, "index", since_s, kind, uuid, name, emulated,
       k8s_pod, k8s_namespace, k8s_container
FROM _v6_spans s
WHERE NOT EXISTS (
    SELECT 1 FROM _v6_interleaved i
    WHERE i.node = s.node AND i.source = s.source AND i.device = s.device
      AND i."index" IS NOT DISTINCT FROM s."index");

INSERT INTO devices
SELECT node, source, device, "index", at_s, kind, uuid, name, emulated,
       k8s_pod, k8s_namespace, k8s_container
FROM (
    SELECT s.*,
           row(s.kind, s.uuid, s.name, s.emulated, s.k8s_pod, s.k8s_namespace, s.k8s_container)
           IS DISTINCT FROM lag(row(s.kind, s.uuid, s.name, s.emulated, s.k8s_pod, s.k8s_namespace,
                                    s.k8s_container))
                            OVER (PARTITION BY s.node, s.source, s.device, s."index" ORDER BY s.at_s)
           AS changed
    FROM _v6_seen s SEMI JOIN _v6_interleaved i
      ON i.node = s.node AND i.source = s.source AND i.device = s.device
     AND i."index" IS NOT DISTINCT FROM s."index"
)
WHERE changed;

DROP TABLE _v6_interleaved;
DROP TABLE _v6_spans;
DROP VIEW _v6_seen;

ALTER TABLE gpu_samples DROP COLUMN kind;
ALTER TABLE gpu_samples DROP COLUMN uuid;
ALTER TABLE gpu_samples DROP COLUMN name;
ALTER TABLE gpu_samples DROP COLUMN k8s_pod;
ALTER TABLE gpu_samples DROP COLUMN k8s_namespace;
ALTER TABLE gpu_samples DROP COLUMN k8s_container;
ALTER TABLE gpu_samples_10s DROP COLUMN kind;
ALTER TABLE gpu_samples_10s DROP COLUMN uuid;
ALTER TABLE gpu_samples_10s DROP COLUMN name;
ALTER TABLE gpu_samples_10s DROP COLUMN k8s_pod;
ALTER TABLE gpu_samples_10s DROP COLUMN k8s_namespace;
ALTER TABLE gpu_samples_10s DROP COLUMN k8s_container;

-- gpu_samples in its version-5 shape: each sample with the attributes in effect at its ts_s.
CREATE VIEW gpu_samples_full AS
SELECT s.node, s.source, s.ts_s, s.device, d.kind, s."index", d.uuid, d.name, s.emulated,
       s.* EXCLUDE (node, source, ts_s, device, "index", emulated),
       d.k8s_pod, d.k8s_namespace, d.k8s_container
FROM gpu_samples s ASOF LEFT JOIN devices d
  ON s.node = d.node AND s.source = d.source AND s.device = d.device
 AND s."index" IS NOT DISTINCT FROM d."index" AND s.ts_s >= d.since_s;

-- gpu_samples_10s in its version-5 shape: each bucket with the attributes in effect at its end
-- (10.0: the bucket length; a GPU's first sample may lie inside its first bucket).
CREATE VIEW gpu_samples_10s_full AS
SELECT r.node, r.source, r.device, r.bucket_start_s, d.kind, r."index", d.uuid, d.name, r.emulated,
       r.* EXCLUDE (node, source, device, bucket_start_s, "index", emulated),
       d.k8s_pod, d.k8s_namespace, d.k8s_container
FROM gpu_samples_10s r ASOF LEFT JOIN devices d
  ON r.node = d.node AND r.source = d.source AND r.device = d.device
 AND r."index" IS NOT DISTINCT FROM d."index" AND r.bucket_start_s + 10.0 > d.since_s;
"""


# The views of migration 6 with the device columns migration 7 adds (a sample's own columns come
# through ``s.*`` / ``r.*``); migration 8 adds ``worker`` and ``role`` at the end.
def _full_views(extra_device_columns: str) -> str:
    return f"""
CREATE OR REPLACE VIEW gpu_samples_full AS
SELECT s.node, s.source, s.ts_s, s.device, d.kind, s."index", d.uuid, d.name, s.emulated,
       s.* EXCLUDE (node, source, ts_s, device, "index", emulated),
       d.k8s_pod, d.k8s_namespace, d.k8s_container,
       d.parent_uuid, d.mig_instance_id, d.mig_profile, d.exporter_hostname{extra_device_columns}
FROM gpu_samples s ASOF LEFT JOIN devices d
  ON s.node = d.node AND s.source = d.source AND s.device = d.device
 AND s."index" IS NOT DISTINCT FROM d."index" AND s.ts_s >= d.since_s;

CREATE OR REPLACE VIEW gpu_samples_10s_full AS
SELECT r.node, r.source, r.device, r.bucket_start_s, d.kind, r."index", d.uuid, d.name, r.emulated,
       r.* EXCLUDE (node, source, device, bucket_start_s, "index", emulated),
       d.k8s_pod, d.k8s_namespace, d.k8s_container,
       d.parent_uuid, d.mig_instance_id, d.mig_profile, d.exporter_hostname{extra_device_columns}
FROM gpu_samples_10s r ASOF LEFT JOIN devices d
  ON r.node = d.node AND r.source = d.source AND r.device = d.device
 AND r."index" IS NOT DISTINCT FROM d."index" AND r.bucket_start_s + 10.0 > d.since_s;
"""


def _v7_sql() -> str:
    metric_cols = "\n".join(
        f"ALTER TABLE gpu_samples ADD COLUMN {m} DOUBLE;\n"
        f"ALTER TABLE gpu_samples_10s ADD COLUMN avg_{m} DOUBLE;\n"
        f"ALTER TABLE gpu_samples_10s ADD COLUMN max_{m} DOUBLE;"
        for m in _V7_SAMPLE_METRICS
    )
    return f"""
-- The engine (vllm | sglang | dynamo | dynamo_worker | lmcache | phaselens) each scraped row came from.
ALTER TABLE engine_metrics ADD COLUMN engine VARCHAR;

-- GPU-instance (MIG) metrics and PCIe rates from dcgm-exporter.
{metric_cols}

-- A MIG instance is a device of its own (cuda:N/gi<GPU_I_ID>) whose parent_uuid is the physical GPU's
-- UUID; a whole GPU has these NULL. exporter_hostname: the Hostname/hostname label of a dcgm-exporter.
ALTER TABLE devices ADD COLUMN parent_uuid VARCHAR;
ALTER TABLE devices ADD COLUMN mig_instance_id INTEGER;
ALTER TABLE devices ADD COLUMN mig_profile VARCHAR;
ALTER TABLE devices ADD COLUMN exporter_hostname VARCHAR;
{_full_views("")}"""


# Which GPU a worker ran on, and in which role. Iterations carry the GPU's identity (uuid, index)
# from the worker that ran them; ``devices`` rows carry the worker and role owning the GPU (a role
# change starts a new row, valid from ``since_s``). Telemetry batches record the serving endpoint
# they were read from, so a restarted collector resumes each producer's sequence where it stopped.
# ``lag_s``/``modeled_s`` are the emulated device's pacing lag and modeled duration per iteration;
# ``gpu_samples.host_bound_pct`` (rolled up as avg/max) marks the emulated samples whose window the
# host could not pace, and ``emulation_samples`` keeps an emulated GPU's cumulative counters.
def _v8_sql() -> str:
    return f"""
ALTER TABLE iterations ADD COLUMN gpu_uuid VARCHAR;
ALTER TABLE iterations ADD COLUMN gpu_index INTEGER;
ALTER TABLE iterations ADD COLUMN lag_s DOUBLE;
ALTER TABLE iterations ADD COLUMN modeled_s DOUBLE;
ALTER TABLE devices ADD COLUMN worker VARCHAR;
ALTER TABLE devices ADD COLUMN role VARCHAR;
ALTER TABLE telemetry_batches ADD COLUMN endpoint VARCHAR;
ALTER TABLE gpu_samples ADD COLUMN host_bound_pct DOUBLE;
ALTER TABLE gpu_samples_10s ADD COLUMN avg_host_bound_pct DOUBLE;
ALTER TABLE gpu_samples_10s ADD COLUMN max_host_bound_pct DOUBLE;

CREATE TABLE emulation_samples (
    node                     VARCHAR NOT NULL,
    source                   VARCHAR NOT NULL,
    ts_s                     DOUBLE  NOT NULL,   -- the same ts_s as the gpu_samples row of the snapshot
    device                   VARCHAR NOT NULL,
    "index"                  INTEGER,
    window_s                 DOUBLE,             -- trailing window of the sample's means
    uptime_s                 DOUBLE,             -- device-clock seconds the cumulative counters cover
    busy_s_total             DOUBLE,
    sm_active_s_total        DOUBLE,
    sm_occupancy_s_total     DOUBLE,
    tensor_active_s_total    DOUBLE,
    dram_active_s_total      DOUBLE,
    mem_active_s_total       DOUBLE,
    iterations_total         BIGINT,
    paced_iterations_total   BIGINT,
    lagged_iterations_total  BIGINT,
    lag_s_total              DOUBLE,
    modeled_s_total          DOUBLE
);
{_full_views(", d.worker, d.role")}
-- Each iteration with the worker's role on its GPU at the iteration's start (the devices row of
-- that GPU, by uuid, in effect then; NULL before the GPU's first sample with a worker).
CREATE VIEW iterations_full AS
SELECT i.*, d.role, d.device AS gpu_device, d.name AS gpu_name, d.emulated AS gpu_emulated
FROM iterations i ASOF LEFT JOIN (SELECT * FROM devices WHERE worker IS NOT NULL) d
  ON i.node = d.node AND i.gpu_uuid = d.uuid AND i.start_s >= d.since_s;
"""


# Simulated scenarios (``phaselens simulate``): one ``scenarios`` row per run, and every row the run
# produced carries ``node = 'sim:' || scenario_id`` (and ``source = 'simulated'`` where the table has
# a source; its gpu_samples are ``emulated``). ``trust_label`` is the one definition analytics use
# to tell simulated, emulated and measured rows apart.
SIMULATED_NODE_PREFIX = "sim:"

_V9_SCENARIOS = """
CREATE TABLE scenarios (
    scenario_id VARCHAR NOT NULL,
    node        VARCHAR NOT NULL,   -- 'sim:' || scenario_id: the node of every row of the scenario
    created_s   DOUBLE  NOT NULL,   -- wall clock when the run started
    label       VARCHAR NOT NULL,   -- 'simulated' (the trust label of the scenario's rows)
    name        VARCHAR,
    model       VARCHAR,
    gpu         VARCHAR,
    layout      JSON,
    trace       JSON,
    params      JSON,
    start_s     DOUBLE,             -- virtual time span of the scenario (UTC epoch s)
    end_s       DOUBLE,
    wall_s      DOUBLE,             -- wall-clock seconds the simulation took
    summary     JSON,
    CHECK (node = 'sim:' || scenario_id)
);

-- 'simulated' | 'emulated' | 'measured' for a row's (node, source, emulated); the two-argument form
-- is for tables without an emulated column.
CREATE MACRO trust_label(node, source, emulated) AS
    CASE WHEN starts_with(node, 'sim:') OR source = 'simulated' THEN 'simulated'
         WHEN emulated THEN 'emulated'
         ELSE 'measured' END,
  (node, source) AS
    CASE WHEN starts_with(node, 'sim:') OR source = 'simulated' THEN 'simulated'
         ELSE 'measured' END;
"""


# gpu_samples keyed (collector/store/gpu_keys.py): the rows in gpu_sample_rows with one INTEGER
# gpu_key per GPU identity (gpu_keys) in place of node, source, device, index and emulated;
# gpu_samples becomes a view of the old shape (column order kept), so readers are unchanged.
_V10_GPU_KEYS = """
CREATE TABLE gpu_keys (
    gpu_key  INTEGER NOT NULL PRIMARY KEY,
    node     VARCHAR NOT NULL,
    source   VARCHAR NOT NULL,
    device   VARCHAR NOT NULL,
    "index"  INTEGER,
    emulated BOOLEAN NOT NULL
);
INSERT INTO gpu_keys
SELECT (row_number() OVER (ORDER BY node, source, device, "index", emulated) - 1)::INTEGER,
       node, source, device, "index", emulated
FROM (SELECT DISTINCT node, source, device, "index", emulated FROM gpu_samples);

CREATE TABLE gpu_sample_rows AS
SELECT 0::INTEGER AS gpu_key, * EXCLUDE (node, source, device, "index", emulated) FROM gpu_samples LIMIT 0;
ALTER TABLE gpu_sample_rows ALTER COLUMN gpu_key SET NOT NULL;
ALTER TABLE gpu_sample_rows ALTER COLUMN ts_s SET NOT NULL;
INSERT INTO gpu_sample_rows
SELECT k.gpu_key, s.* EXCLUDE (node, source, device, "index", emulated)
FROM gpu_samples s JOIN gpu_keys k
  ON s.node = k.node AND s.source = k.source AND s.device = k.device
 AND s."index" IS NOT DISTINCT FROM k."index" AND s.emulated = k.emulated
ORDER BY s.ts_s;

DROP TABLE gpu_samples;
CREATE VIEW gpu_samples AS
SELECT k.node, k.source, r.ts_s, k.device, k."index", k.emulated, r.* EXCLUDE (gpu_key, ts_s)
FROM gpu_sample_rows r JOIN gpu_keys k ON r.gpu_key = k.gpu_key;
"""

# The worker that generated a token (its request's decode worker, else its prefill worker), stored
# with it so that tokens per worker are one grouped scan, not a join of every token to its request.
# Rows from before (NULL) are joined to their requests by the readers (analytics.cost.token_counts).
_V12_TOKEN_WORKER = "ALTER TABLE tokens ADD COLUMN worker VARCHAR;"

# Workloads (analytics/workload/): one row per description of a window's workload, ``kind``
# 'observed' (from requests rows or engine histograms) or 'synthesized' (a trace made from an observed
# one, measured back: ``observed_id`` names it), so the two are stored and shown side by side. The
# summary columns carry units in their names; ``details`` holds the whole description (rate curve,
# hourly rates, the joint length histogram, retained length pairs) and ``trust`` its labels and notes.
_V13_WORKLOADS = """
CREATE TABLE workloads (
    workload_id           VARCHAR NOT NULL,
    node                  VARCHAR NOT NULL,   -- the collector (or host) that stored it
    ts_s                  DOUBLE  NOT NULL,   -- when it was stored
    kind                  VARCHAR NOT NULL,   -- observed | synthesized
    source                VARCHAR NOT NULL,   -- requests | engine_histograms | trace
    dataset               VARCHAR NOT NULL,   -- live | a scenario id
    start_s               DOUBLE  NOT NULL,   -- the window observed (UTC epoch s)
    end_s                 DOUBLE  NOT NULL,
    observed_id           VARCHAR,            -- synthesized: the observed workload it follows
    request_count         BIGINT,
    mean_rps              DOUBLE,
    peak_rps              DOUBLE,
    interarrival_cv       DOUBLE,
    burstiness_cv         DOUBLE,
    gamma_shape           DOUBLE,
    dispersion_index      DOUBLE,
    prompt_tokens_mean    DOUBLE,
    prompt_tokens_p50     DOUBLE,
    prompt_tokens_p90     DOUBLE,
    prompt_tokens_p99     DOUBLE,
    output_tokens_mean    DOUBLE,
    output_tokens_p50     DOUBLE,
    output_tokens_p90     DOUBLE,
    output_tokens_p99     DOUBLE,
    prefix_reuse_ratio    DOUBLE,             -- 0-1; NULL: not known (details say why)
    trust                 JSON    NOT NULL,   -- {"labels": [...], "notes": [...]}
    details               JSON
);
"""

# The roofline of each iteration (issue 23 point 4): its work on the row's GPU, counted by the GPU model
# for emulated and simulated iterations and by the engine from its own tensors' shapes on a real GPU
# (serving/devices/roofline.py). MFU = flops / (busy s · dense peak of the dtype), MBU = hbm_bytes /
# (busy s · peak HBM bytes/s): analytics/roofline.py. NULL: not counted (older rows, other engines).
_V14_ROOFLINE = """
ALTER TABLE iterations ADD COLUMN flops DOUBLE;
ALTER TABLE iterations ADD COLUMN hbm_bytes DOUBLE;
"""

# Power calibrations (issue 24, phaselens/power/): one row per sweep of one role (phase) of a serving
# stack or a simulated layout over power limits and SM-clock windows, keyed by the GPU model, its
# driver and the engine fingerprint (model, dtype, TP, engine version; ``fingerprint`` hashes them
# all). A row whose fingerprint no longer matches the running stack is marked ``stale`` (status, the
# one column collector/store/updates.py may change) and never used. Every measured point is in
# ``points``; ``reference`` is the default settings', ``cliff`` the first setting per knob where
# latency rose beyond the noise.
_V15_POWER_CALIBRATIONS = """
CREATE TABLE power_calibrations (
    calibration_id   VARCHAR NOT NULL,
    node             VARCHAR NOT NULL,   -- the host that ran or stored it
    ts_s             DOUBLE  NOT NULL,   -- when it ended
    source           VARCHAR NOT NULL,   -- live | simulated
    target           VARCHAR,            -- stack:<router URL> | sim:<layout>
    gpu_model        VARCHAR NOT NULL,   -- the NVML name (emulated: '... (emulated)')
    driver           VARCHAR,            -- the NVIDIA driver; emulated/simulated: the GPU model's
    model            VARCHAR NOT NULL,   -- the served (emulated: modeled) model shape
    dtype            VARCHAR,
    tp               INTEGER,
    engine_version   VARCHAR,
    fingerprint      VARCHAR NOT NULL,   -- hash of gpu_model, driver, model, dtype, tp, engine_version
    role             VARCHAR NOT NULL,   -- mixed | prefill | decode
    phase            VARCHAR NOT NULL,   -- mixed | prefill | decode
    status           VARCHAR NOT NULL,   -- current | stale | incomplete
    duration_s       DOUBLE,             -- the sweep's wall (live) or virtual (simulated) time
    noise_pct        DOUBLE,             -- latency noise between the two reference runs
    reference        JSON,               -- the default settings' figures
    cliff            JSON,               -- per knob: the first setting where latency rose
    points           JSON    NOT NULL,   -- every setting measured: setting and figures
    trust            JSON,               -- labels (measured | emulated | simulated, host-bound)
    details          JSON                -- workload, load, bounds, notes
);
"""

MIGRATIONS: tuple[Migration, ...] = (
    Migration(1, "device and host samples, ingest errors", V1_SAMPLES),
    Migration(2, "serving telemetry: batches, iterations, requests, tokens, control, gaps", V2_TELEMETRY),
    Migration(3, "Prometheus-scraped engine metrics", V3_ENGINE_METRICS),
    Migration(4, "analytics: calibrations, recommendations, actions (audit), reports", V4_ANALYTICS),
    Migration(5, "10 s rollup of gpu_samples", _rollup_ddl()),
    Migration(6, "devices: per-GPU attributes out of gpu_samples(_10s); *_full views", _V6_DEVICES),
    Migration(
        7, "engine_metrics.engine; MIG instances, GR engine activity and PCIe rates of GPUs", _v7_sql()
    ),
    Migration(
        8,
        "GPU identity: iterations gpu_uuid/gpu_index/lag_s/modeled_s, devices worker/role; emulation lag",
        _v8_sql(),
    ),
    Migration(9, "simulated scenarios: scenarios table, trust_label macro", _V9_SCENARIOS),
    Migration(10, "gpu_samples keyed: gpu_sample_rows + gpu_keys, gpu_samples a view", _V10_GPU_KEYS),
    Migration(
        11,
        "iteration_seconds: iterations rolled up per worker, GPU and second",
        iteration_seconds.DDL + iteration_seconds.rebuild_sql() + ";",
    ),
    Migration(12, "tokens.worker: the worker that generated the token", _V12_TOKEN_WORKER),
    Migration(13, "workloads: observed and synthesized workload descriptions", _V13_WORKLOADS),
    Migration(14, "iterations flops/hbm_bytes: each iteration's work for MFU and MBU", _V14_ROOFLINE),
    Migration(
        15,
        "power_calibrations: power-limit and SM-clock sweeps per GPU, engine and phase",
        _V15_POWER_CALIBRATIONS,
    ),
)

LATEST_VERSION: int = MIGRATIONS[-1].version


def current_version(con: duckdb.DuckDBPyConnection) -> int:
    """Return the highest applied migration version of an open database (0 for a fresh file)."""
    if not _table_exists(con, "schema_version"):
        return 0
    row = con.execute("SELECT max(version) FROM schema_version").fetchone()
    return int(row[0]) if row and row[0] is not None else 0


def check_version(
    con: duckdb.DuckDBPyConnection, where: str, migrations: Sequence[Migration] = MIGRATIONS
) -> int:
    """Return the file's schema version; StoreError when it is newer than ``migrations`` know.

    Also refuses a DuckDB file that holds other tables but no ``schema_version`` (not a store).
    """
    version = current_version(con)
    known = migrations[-1].version if migrations else 0
    if version > known:
        raise StoreError(
            f"{where} has schema version {version}, newer than this phaselens knows "
            f"(version {known}); upgrade phaselens to open it (the file was left unchanged)"
        )
    if version == 0:
        others = con.execute(
            "SELECT string_agg(table_name, ', ' ORDER BY table_name) FROM information_schema.tables "
            "WHERE table_schema = 'main' AND table_catalog = current_database()"
        ).fetchone()[0]
        if others:
            raise StoreError(
                f"{where} is a DuckDB file without a phaselens schema_version table "
                f"(it holds: {others}); refusing to add the phaselens schema to it"
            )
    return version


def apply_migrations(
    con: duckdb.DuckDBPyConnection,
    *,
    where: str = "the database",
    target_version: int | None = None,
    migrations: Sequence[Migration] = MIGRATIONS,
) -> list[int]:
    """Apply every pending migration up to ``target_version`` (default: all) in ONE transaction.

    Returns the versions applied (empty when up to date). On any failure the transaction is
    rolled back, so the file stays at its old version, and StoreError says which step failed.
    """
    current = check_version(con, where, migrations)
    target = migrations[-1].version if target_version is None else target_version
    pending = [m for m in migrations if current < m.version <= target]
    if not pending:
        return []
    step = pending[0]
    con.begin()
    try:
        con.execute(SCHEMA_VERSION_DDL)
        for step in pending:
            con.execute(step.sql)
            con.execute(
                "INSERT INTO schema_version VALUES (?, ?, ?)", [step.version, step.description, time.time()]
            )
        con.commit()
    except duckdb.Error as e:
        con.rollback()
        raise StoreError(
            f"migrating {where} failed at version {step.version} ({step.description}): {e}; "
            f"the file stays at version {current}"
        ) from e
    return [m.version for m in pending]


def _table_exists(con: duckdb.DuckDBPyConnection, name: str) -> bool:
    row = con.execute(
        "SELECT count(*) FROM information_schema.tables "
        "WHERE table_schema = 'main' AND table_catalog = current_database() AND table_name = ?",
        [name],
    ).fetchone()
    return bool(row and row[0])
