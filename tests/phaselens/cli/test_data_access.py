"""phaselens/cli/data_access.py: how the report, workload, recommend, export and apply commands open
``--db FILE`` and read the collector's answers — a real store file, a second process holding it,
real httpx responses."""

from __future__ import annotations

import signal
from pathlib import Path

import httpx
import pytest

from collector.store import Store
from phaselens.cli.data_access import api_error_message, control_headers, open_store_file
from tests.collector.store.conftest import spawn_python, wait_for_line


class CommandError(Exception):
    pass


def test_a_missing_store_file_is_named_and_not_created(tmp_path: Path) -> None:
    db = tmp_path / "none.duckdb"
    with pytest.raises(CommandError, match=f"^--db {db}: no such store file$"):
        open_store_file(str(db), CommandError, "drop --db")
    assert not db.exists()


def test_a_store_file_opens_read_only_or_for_writing(tmp_path: Path) -> None:
    db = tmp_path / "s.duckdb"
    Store.open(db).close()
    with open_store_file(str(db), CommandError, "drop --db", read_only=True) as store:
        assert store.query("SELECT count(*) AS n FROM gpu_samples")["n"][0] == 0
    with open_store_file(str(db), CommandError, "drop --db") as store:
        store.append("host_samples", [{"node": "n", "ts_s": 1.0, "pid": 1}])


def test_a_store_a_running_collector_holds_says_what_to_do_instead(tmp_path: Path) -> None:
    db = tmp_path / "held.duckdb"
    Store.open(db).close()
    child = spawn_python(
        f"import time\nfrom collector.store import Store\ns = Store.open({str(db)!r})\nprint('open', flush=True)\n"
        "time.sleep(60)\n"
    )
    try:
        wait_for_line(child, "open")
        with pytest.raises(CommandError) as err:
            open_store_file(str(db), CommandError, "drop --db to read it through the collector")
        assert str(err.value).endswith(
            "; a running collector holds it: drop --db to read it through the collector"
        )
        assert f"{db} is open by another phaselens collector" in str(err.value)
    finally:
        child.send_signal(signal.SIGKILL)
        child.communicate(timeout=10)


def test_control_headers_take_the_token_given_else_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PHASELENS_CONTROL_TOKEN", raising=False)
    assert control_headers(None) == {}
    assert control_headers("abc") == {"Authorization": "Bearer abc"}
    monkeypatch.setenv("PHASELENS_CONTROL_TOKEN", "env-token")
    assert control_headers(None) == {"Authorization": "Bearer env-token"}
    assert control_headers("abc") == {"Authorization": "Bearer abc"}


def test_api_error_message_reads_the_collectors_error_else_the_body() -> None:
    error = httpx.Response(400, json={"error": {"code": "bad_request", "message": "since: not a time"}})
    assert api_error_message(error) == "since: not a time"
    assert api_error_message(httpx.Response(500, json={"detail": "x"})) == '{"detail":"x"}'
    assert api_error_message(httpx.Response(502, text="<html>" + "x" * 400)) == ("<html>" + "x" * 400)[:300]
