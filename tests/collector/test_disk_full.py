"""A full disk under the real collector (`phaselens collect`) and the real serving stack: requests
served while the store cannot write are held or re-served by the stack's ring, so once space
returns every request and every token is stored, also across collector restarts; /health reads
``degraded`` naming the cause meanwhile, and held rows dropped past the bound are recorded as gaps.

Two ways to fill the disk: a real 12 MB tmpfs where the test may mount one (root with
CAP_SYS_ADMIN), else skipped with the reason; and always ``OSError(ENOSPC)`` injected at the
store's write (tests/collector/enospc_collect.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from collector.store import Store
from serving.loadgen import run_load
from serving.trace import poisson_trace
from tests.collector.conftest import collect_command
from tests.collector.enospc_collect import FLAG_ENV
from tests.collector.test_service import wait_for
from tests.serving.conftest import Server, free_port, start_server, stop_server

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]
OUTPUT_TOKENS = 8


@dataclass
class Sent:
    """What the stack served so far (every test's collector reads the stack's whole ring)."""

    requests: int = 0
    tokens: int = 0
    seed: int = 100


@dataclass
class StackUnderTest:
    server: Server
    sent: Sent = field(default_factory=Sent)

    def serve(self, n: int) -> None:
        """Serve ``n`` requests (all must succeed) and count them."""
        self.sent.seed += 1
        trace = poisson_trace(40, n, prompt_tokens=32, output_tokens=OUTPUT_TOKENS, seed=self.sent.seed)
        report = run_load(self.server.url, trace, progress=False)
        assert report.n_ok == n, [r.error for r in report.results if not r.ok]
        self.sent.requests += n
        self.sent.tokens += report.completion_tokens_total


@pytest.fixture(scope="module")
def stack() -> Iterator[StackUnderTest]:
    server = start_server(
        "--mode", "disaggregated", "--device", "emulated:h100-sxm", "--emulate-shape", "llama-3.1-8b"
    )
    try:
        yield StackUnderTest(server)
    finally:
        stop_server(server)


class CollectProcess:
    """One `phaselens collect` process on ``db`` reading the stack (``injected``: through the
    ENOSPC wrapper, failing while ``flag`` exists)."""

    def __init__(self, db: Path, stack: StackUnderTest, *args: str, flag: Path | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = collect_command(db, self.port)
        env = dict(os.environ)
        if flag is not None:
            cmd[1:3] = ["-m", "tests.collector.enospc_collect"]
            env[FLAG_ENV] = str(flag)
        cmd += ["--serving", stack.server.url, "--flush-interval", "0.2", "--report-schedule", "off", *args]
        self.proc = subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True)
        wait_for(self._up, timeout_s=60)

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"collector exited {self.proc.returncode}: {self.proc.stderr.read()}")
        try:
            return httpx.get(f"{self.url}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def health(self) -> dict:
        return httpx.get(f"{self.url}/health", timeout=30).json()

    def count(self, table: str) -> int:
        """Rows of ``table`` through the collector's API."""
        r = httpx.get(f"{self.url}/api/v1/tables/{table}", params={"limit": 100_000}, timeout=60)
        assert r.status_code == 200, r.text
        return len(r.json()["rows"])

    def stop(self) -> str:
        """SIGTERM and wait; the process's stderr."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return err


def stored(db: Path) -> dict[str, int]:
    """Requests, tokens (rows of ``tokens``), duplicate request ids and store gaps in the file."""
    with Store.open(db, read_only=True) as store:

        def one(sql: str) -> int:
            return int(store.query(sql).iloc[0, 0] or 0)

        return {
            "requests": one("SELECT count(*) FROM requests"),
            "tokens": one("SELECT count(*) FROM tokens"),
            "duplicates": one(
                "SELECT count(*) FROM (SELECT request_id FROM requests GROUP BY 1 HAVING count(*) > 1)"
            ),
            "telemetry_gaps": one("SELECT count(*) FROM telemetry_gaps"),
            "gap_rows": one("SELECT coalesce(sum(count), 0) FROM ingest_errors WHERE kind = 'store_gap'"),
        }


def all_stored(c: CollectProcess, stack: StackUnderTest) -> Callable[[], bool]:
    return lambda: c.count("requests") == stack.sent.requests and c.count("tokens") == stack.sent.tokens


def exercise_full_disk(
    stack: StackUnderTest,
    db: Path,
    fill: Callable[[], None],
    free: Callable[[], None],
    *args: str,
    flag: Path | None = None,
    expect_drops: bool = False,
) -> None:
    """Serve, fill the disk, serve 20, free it, serve 20 more: all stored; then restarts (one
    while the disk is full) lose nothing either."""
    c = CollectProcess(db, stack, *args, flag=flag)
    try:
        stack.serve(4)
        wait_for(all_stored(c, stack), timeout_s=60)
        fill()
        stack.serve(20)
        wait_for(lambda: c.health()["writer"]["write_failure"] is not None, timeout_s=60)
        if expect_drops:  # the held buffer overflows with sample rows: dropped, listed, counted
            wait_for(lambda: c.health()["writer"]["store_gaps_total"] >= 1, timeout_s=60)
        full = c.health()
        assert full["status"] == "degraded", full
        assert full["reasons"][0].startswith("store writes failing: no space left on device"), full["reasons"]
        assert full["writer"]["held_rows"] > 0 and full["writer"]["rows_lost"] == 0, full
        assert c.count("requests") < stack.sent.requests  # the 20 are not committed yet
        free()
        stack.serve(20)
        wait_for(all_stored(c, stack), timeout_s=90)
        wait_for(lambda: c.health()["status"] == "ok", timeout_s=30)
        health = c.health()
        writer = health["writer"]
        assert writer["write_failure"] is None and writer["rows_lost"] == 0 and writer["store_errors"] >= 1
        telemetry = next(s for s in health["sources"] if s["name"].startswith("serving:"))
        assert telemetry["telemetry_gaps"] == 0
        drops = writer["rows_dropped"]
        if expect_drops:
            assert drops and set(drops) <= {"gpu_samples", "emulation_samples", "host_samples"}, drops
            gap = writer["store_gaps"][0]
            assert gap["from_s"] <= gap["to_s"] and gap["rows"] > 0
            assert gap["cause"] == "no space left on device"
        else:
            assert drops == {}
    finally:
        c.stop()
    after = stored(db)
    assert after["requests"] == stack.sent.requests and after["tokens"] == stack.sent.tokens, after
    assert after["duplicates"] == 0 and after["telemetry_gaps"] == 0
    assert after["gap_rows"] == sum(drops.values())  # every dropped row recorded as a gap

    # a restart reads on from the stored (committed) cursors: nothing again, nothing missing
    c = CollectProcess(db, stack, *args, flag=flag)
    try:
        stack.serve(3)
        wait_for(all_stored(c, stack), timeout_s=60)
        fill()  # the collector stops while the disk is full: what it held is lost with it ...
        stack.serve(6)
        wait_for(lambda: c.health()["writer"]["write_failure"] is not None, timeout_s=60)
    finally:
        err = c.stop()
    assert "rows not written" in err, err  # said, not silent
    free()
    c = CollectProcess(db, stack, *args, flag=flag)  # ... and re-read from the stack's ring
    try:
        wait_for(all_stored(c, stack), timeout_s=60)
    finally:
        c.stop()
    after = stored(db)
    assert after["requests"] == stack.sent.requests and after["tokens"] == stack.sent.tokens, after
    assert after["duplicates"] == 0 and after["telemetry_gaps"] == 0


def test_injected_enospc_loses_no_request_and_records_dropped_samples_as_gaps(
    stack: StackUnderTest, tmp_path: Path
) -> None:
    flag = tmp_path / "disk-is-full"
    exercise_full_disk(
        stack,
        tmp_path / "enospc.duckdb",
        flag.touch,
        lambda: flag.unlink(missing_ok=True),
        "--max-held-rows",
        "100",  # the stack's samples (~40 rows/s) pass this in 2-3 s: the oldest are dropped
        flag=flag,
        expect_drops=True,
    )


def _mount_tmpfs(where: Path, size: str) -> str | None:
    """Mount a tmpfs of ``size`` at ``where``; why not, or None when mounted."""
    if os.geteuid() != 0:
        return "not root: cannot mount a small tmpfs to fill"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True
    )
    if done.returncode != 0:
        return f"mount -t tmpfs not permitted here (CAP_SYS_ADMIN?): {done.stderr.strip()}"
    return None


def test_a_real_full_disk_loses_no_request_and_no_token(stack: StackUnderTest) -> None:
    where = Path(tempfile.mkdtemp(prefix="phaselens-full-"))
    why = _mount_tmpfs(where, "12m")
    if why is not None:
        os.rmdir(where)
        pytest.skip(why)
    filler = where / "filler"

    def fill() -> None:
        with filler.open("ab", buffering=0) as f:
            try:
                while True:
                    f.write(b"\0" * (1 << 16))
                    f.flush()
            except OSError:
                pass

    try:
        exercise_full_disk(stack, where / "full.duckdb", fill, lambda: filler.unlink(missing_ok=True))
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
        os.rmdir(where)
