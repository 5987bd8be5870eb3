"""Readers on their own threads and closing the store under them."""

from __future__ import annotations

import threading

import pytest

from collector.store import Store, StoreError

# a query that runs for minutes unless interrupted
ENDLESS = "SELECT count(*) FROM range(100000000000) a WHERE a.range % 7 = 3"


def test_close_interrupts_a_running_reader_and_refuses_new_ones(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    started, outcome = threading.Event(), {}

    def read() -> None:
        try:
            with store.reader() as cur:
                started.set()
                cur.execute(ENDLESS).fetchall()
            outcome["result"] = "finished"
        except StoreError as e:
            outcome["result"] = e

    t = threading.Thread(target=read)
    t.start()
    assert started.wait(10)
    store.close()  # does not raise although a query is running on a reader cursor
    t.join(30)
    assert not t.is_alive()
    assert isinstance(outcome["result"], StoreError)
    with pytest.raises(StoreError, match=r"is clos(ed|ing)"), store.reader():
        pass
    with Store.open(tmp_path / "s.duckdb") as again:  # the file was released
        assert again.query("SELECT 1 AS x")["x"].tolist() == [1]


def test_close_waits_for_a_reader_that_finishes_on_its_own(tmp_path):
    store = Store.open(tmp_path / "s.duckdb")
    inside, release, done = threading.Event(), threading.Event(), threading.Event()

    def read() -> None:
        with store.reader() as cur:
            assert cur.execute("SELECT 42").fetchone() == (42,)
            inside.set()
            release.wait(10)  # holds its cursor, running nothing (a query now would be interrupted)
        done.set()

    t = threading.Thread(target=read)
    t.start()
    assert inside.wait(10)
    closer = threading.Thread(target=store.close)
    closer.start()
    closer.join(0.3)
    assert closer.is_alive()  # waiting for the reader, not closing under it
    release.set()
    closer.join(30)
    t.join(30)
    assert done.is_set() and not closer.is_alive()
