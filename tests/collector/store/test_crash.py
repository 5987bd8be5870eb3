"""Crash safety: a writer SIGKILLed mid-run leaves a file that opens cleanly.

What survives: everything checkpointed, and every flushed (committed) append after the last
checkpoint too -- DuckDB replays its write-ahead log on the next open. What is lost: only rows
still in the Store's in-memory buffer (at most ``buffer_rows`` rows: the last unflushed batch).
"""

from __future__ import annotations

import signal
from pathlib import Path

from collector.store import Store
from tests.collector.store.conftest import spawn_python, wait_for_line

CHILD = """
import time
from collector.store import Store

def rows(start, n):
    return [{"node": "n", "source": "nvml", "ts_s": float(start + i), "device": "cuda:0",
             "emulated": False, "power_w": 300.0} for i in range(n)]

store = Store.open(PATH, buffer_rows=1_000_000)
for k in range(3):                       # checkpointed: in the database file
    store.append("gpu_samples", rows(k * 1000, 1000))
store.checkpoint()
for k in range(3, 5):                    # flushed (committed to the WAL), not checkpointed
    store.append("gpu_samples", rows(k * 1000, 1000))
store.flush()
store.append("gpu_samples", rows(5000, 1000))   # still in the buffer: lost
print("ready", flush=True)
time.sleep(60)
"""


def test_sigkilled_writer_loses_at_most_the_unflushed_batch(tmp_path: Path) -> None:
    path = tmp_path / "crash.duckdb"
    child = spawn_python(CHILD.replace("PATH", repr(str(path))))
    try:
        wait_for_line(child, "ready")
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)
    assert child.returncode == -signal.SIGKILL

    with Store.open(path) as store:  # no lock left behind, no repair needed
        stats = store.query("SELECT count(*) AS n, max(ts_s) AS hi FROM gpu_samples")
        assert stats["n"][0] >= 3000  # at least the checkpointed rows
        assert stats["n"][0] == 5000  # in fact every committed row (WAL replay)
        assert stats["hi"][0] == 4999.0
        store.append(
            "gpu_samples", [{"node": "n", "source": "s", "ts_s": 1.0, "device": "d", "emulated": True}]
        )
        store.checkpoint()
    with Store.open(path, read_only=True) as store:
        assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 5001
