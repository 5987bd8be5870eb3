"""The DDL of the store's first four migrations (collector/store/schema.py applies them): device and
host samples with ingest errors (1), serving telemetry (2), Prometheus-scraped engine metrics (3)
and the analytics tables (4). Released migrations: never edit; add a new one in schema.py.
"""

V1_SAMPLES = """
CREATE TABLE gpu_samples (
    node                    VARCHAR NOT NULL,
    source                  VARCHAR NOT NULL,   -- nvml | emulated | cpu | dcgm | agent ...
    ts_s                    DOUBLE  NOT NULL,
    device                  VARCHAR NOT NULL,   -- spec: cuda:0, emulated:h100-sxm, cpu
    kind                    VARCHAR,            -- cuda | emulated | cpu
    "index"                 INTEGER,
    uuid                    VARCHAR,
    name                    VARCHAR,
    emulated                BOOLEAN NOT NULL,
    gpu_util_pct            DOUBLE,
    mem_util_pct            DOUBLE,
    sm_active_pct           DOUBLE,
    sm_occupancy_pct        DOUBLE,
    tensor_active_pct       DOUBLE,
    dram_active_pct         DOUBLE,
    power_w                 DOUBLE,
    energy_mj               BIGINT,             -- counter since driver load
    power_limit_w           DOUBLE,
    sm_clock_mhz            INTEGER,
    mem_clock_mhz           INTEGER,
    temperature_c           DOUBLE,
    mem_used_bytes          BIGINT,
    mem_total_bytes         BIGINT,
    clock_event_reasons     UBIGINT,            -- NVML clock-event reason bitmask
    locked_sm_clock_min_mhz INTEGER,
    locked_sm_clock_max_mhz INTEGER,
    lost                    BOOLEAN,
    k8s_pod                 VARCHAR,            -- dcgm-exporter pod attribution
    k8s_namespace           VARCHAR,
    k8s_container           VARCHAR
);

CREATE TABLE host_samples (
    node      VARCHAR NOT NULL,
    ts_s      DOUBLE  NOT NULL,
    pid       INTEGER NOT NULL,
    worker    VARCHAR,
    cpu_pct   DOUBLE,
    rss_bytes BIGINT
);

CREATE TABLE ingest_errors (
    node    VARCHAR NOT NULL,
    source  VARCHAR NOT NULL,
    ts_s    DOUBLE  NOT NULL,
    kind    VARCHAR NOT NULL,                   -- invalid_batch | unknown_event_type | invalid_event | ...
    message VARCHAR NOT NULL,
    count   BIGINT  NOT NULL
);
"""

V2_TELEMETRY = """
CREATE TABLE telemetry_batches (
    node                 VARCHAR NOT NULL,
    source               VARCHAR NOT NULL,
    seq                  BIGINT  NOT NULL,
    sent_s               DOUBLE  NOT NULL,
    received_s           DOUBLE  NOT NULL,
    events               INTEGER NOT NULL,
    rejected_events      INTEGER NOT NULL,
    dropped_events_total BIGINT
);

CREATE TABLE iterations (
    node           VARCHAR NOT NULL,
    source         VARCHAR NOT NULL,
    batch_seq      BIGINT,
    worker         VARCHAR NOT NULL,
    device         VARCHAR,
    start_s        DOUBLE  NOT NULL,
    end_s          DOUBLE  NOT NULL,
    phase          VARCHAR NOT NULL,           -- prefill | decode | mixed
    batch_size     INTEGER,
    prefill_tokens INTEGER,
    decode_seqs    INTEGER,
    context_tokens BIGINT,
    kv_blocks_used INTEGER,
    kv_blocks_total INTEGER,
    preempted      INTEGER,
    compute_s      DOUBLE,
    pacing_s       DOUBLE
);

CREATE TABLE requests (
    node                VARCHAR NOT NULL,
    source              VARCHAR NOT NULL,
    batch_seq           BIGINT,
    request_id          VARCHAR NOT NULL,
    arrival_s           DOUBLE  NOT NULL,
    first_scheduled_s   DOUBLE,
    prefill_start_s     DOUBLE,
    prefill_end_s       DOUBLE,
    kv_transfer_start_s DOUBLE,
    kv_transfer_end_s   DOUBLE,
    kv_transfer_bytes   BIGINT,
    first_token_s       DOUBLE,
    finish_s            DOUBLE,
    prompt_tokens       INTEGER,
    output_tokens       INTEGER,
    prefill_worker      VARCHAR,
    decode_worker       VARCHAR,
    status              VARCHAR,               -- ok | error | aborted
    finish_reason       VARCHAR,
    error               VARCHAR,
    attempts            INTEGER,
    preemptions         INTEGER
);

-- One row per output token (the request event's token_ts_s, exploded). itl_s is the gap to the
-- previous token of the same request (NULL for the first), so ITL percentiles are one aggregate.
CREATE TABLE tokens (
    node       VARCHAR NOT NULL,
    request_id VARCHAR NOT NULL,
    idx        INTEGER NOT NULL,
    ts_s       DOUBLE  NOT NULL,
    itl_s      DOUBLE
);

CREATE TABLE control_events (
    node      VARCHAR NOT NULL,
    source    VARCHAR NOT NULL,
    batch_seq BIGINT,
    ts_s      DOUBLE  NOT NULL,
    action    VARCHAR NOT NULL,
    target    VARCHAR,
    before    JSON,
    after     JSON,
    actor     VARCHAR
);

CREATE TABLE telemetry_gaps (
    node            VARCHAR NOT NULL,
    source          VARCHAR NOT NULL,
    after_seq       BIGINT  NOT NULL,
    missing_batches BIGINT  NOT NULL,
    detected_at_s   DOUBLE  NOT NULL
);

CREATE VIEW request_latency AS
SELECT
    node,
    request_id,
    status,
    arrival_s,
    prompt_tokens,
    output_tokens,
    first_scheduled_s - arrival_s            AS queue_s,
    prefill_end_s - prefill_start_s          AS prefill_s,
    kv_transfer_end_s - kv_transfer_start_s  AS kv_transfer_s,
    first_token_s - arrival_s                AS ttft_s,
    finish_s - arrival_s                     AS e2e_s,
    CASE WHEN output_tokens > 1
         THEN (finish_s - first_token_s) / (output_tokens - 1) END AS tpot_s
FROM requests;
"""

V3_ENGINE_METRICS = """
-- Prometheus-scraped aggregates from vLLM / SGLang / Dynamo frontends (one sample per row).
CREATE TABLE engine_metrics (
    node     VARCHAR NOT NULL,
    endpoint VARCHAR NOT NULL,
    ts_s     DOUBLE  NOT NULL,
    metric   VARCHAR NOT NULL,                 -- e.g. vllm:num_requests_running
    labels   JSON    NOT NULL,                 -- {} when the series has none
    value    DOUBLE
);
"""

V4_ANALYTICS = """
CREATE TABLE calibrations (
    calibration_id           VARCHAR NOT NULL,
    node                     VARCHAR NOT NULL,
    ts_s                     DOUBLE  NOT NULL,
    device                   VARCHAR NOT NULL,
    gpu_name                 VARCHAR,
    emulated                 BOOLEAN,
    model                    VARCHAR,
    phase                    VARCHAR NOT NULL,  -- prefill | decode
    knob                     VARCHAR NOT NULL,  -- power_limit | sm_clock_window | none
    power_limit_w            DOUBLE,
    sm_clock_min_mhz         INTEGER,
    sm_clock_max_mhz         INTEGER,
    batch_size               INTEGER,
    duration_s               DOUBLE,
    throughput_tokens_per_s  DOUBLE,
    avg_power_w              DOUBLE,
    energy_per_token_j       DOUBLE,
    iteration_p50_s          DOUBLE,
    details                  JSON
);

CREATE TABLE recommendations (
    recommendation_id            VARCHAR NOT NULL,
    node                         VARCHAR NOT NULL,
    ts_s                         DOUBLE  NOT NULL,
    kind                         VARCHAR NOT NULL,  -- layout | power_limit | sm_clock_window | ...
    target                       VARCHAR,
    current                      JSON,
    proposed                     JSON,
    rationale                    VARCHAR,
    est_tokens_per_j_change_pct  DOUBLE,
    est_latency_change_pct       DOUBLE,
    est_cost_change_usd_per_h    DOUBLE,
    status                       VARCHAR,           -- proposed | applied | dismissed
    details                      JSON
);

-- Audit of every change phaselens made or would have made (dry run).
CREATE TABLE actions (
    action_id         VARCHAR NOT NULL,
    node              VARCHAR NOT NULL,
    ts_s              DOUBLE  NOT NULL,
    actor             VARCHAR NOT NULL,             -- who
    action            VARCHAR NOT NULL,             -- what
    target            VARCHAR,
    before            JSON,
    after             JSON,
    dry_run           BOOLEAN NOT NULL,
    status            VARCHAR NOT NULL,             -- planned | applied | failed | rolled_back
    rolled_back       BOOLEAN NOT NULL,             -- false unless given (TableSpec.defaults)
    rolled_back_at_s  DOUBLE,
    recommendation_id VARCHAR,
    message           VARCHAR
);

CREATE TABLE reports (
    report_id VARCHAR NOT NULL,
    node      VARCHAR NOT NULL,
    ts_s      DOUBLE  NOT NULL,
    kind      VARCHAR NOT NULL,
    title     VARCHAR,
    start_s   DOUBLE,
    end_s     DOUBLE,
    format    VARCHAR,                              -- markdown | html | json
    body      VARCHAR,
    details   JSON
);
"""
