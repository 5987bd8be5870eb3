"""The router's device sampler (``serving/device_sampler.py``): it runs only while read, stops after
``idle_stop_s`` without a read, holds a bounded ring and tells a reader that fell behind how many
ticks it missed. A sampler whose pool is not up yet (``None``) takes empty rounds, so its own
timing and ring are tested here without a stack; the stack's ``/v1/collect`` is tested with real
workers in test_router.py."""

from __future__ import annotations

import asyncio

from serving.device_sampler import DeviceSampler


async def _until(cond, timeout_s: float = 10.0) -> bool:
    loop = asyncio.get_running_loop()
    end = loop.time() + timeout_s
    while loop.time() < end:
        if cond():
            return True
        await asyncio.sleep(0.01)
    return cond()


def test_the_sampler_starts_on_a_read_and_stops_when_nobody_reads():
    async def scenario() -> None:
        s = DeviceSampler(lambda: None, interval_s=0.01, idle_stop_s=0.2)
        assert not s.running
        first = await s.read(None)
        assert s.running
        assert first["ticks"] and first["ticks"][0]["items"] == []  # a round taken at once
        assert await _until(lambda: not s.running), "the sampler kept running with no reader"
        stopped_at = s._ticks[-1].seq
        await asyncio.sleep(0.1)
        assert s._ticks[-1].seq == stopped_at  # no rounds while stopped
        again = await s.read(stopped_at)
        assert s.running  # the next read starts it again, from where the ring left off
        assert [t["seq"] for t in again["ticks"]] == [stopped_at + 1]
        await s.stop()
        assert not s.running

    asyncio.run(scenario())


def test_a_reader_that_falls_behind_the_ring_is_told_how_many_ticks_it_missed():
    async def scenario() -> None:
        s = DeviceSampler(lambda: None, interval_s=0.01, max_ticks=5, idle_stop_s=30.0)
        first = await s.read(None)
        cursor = first["last_seq"]
        assert await _until(lambda: s._ticks[0].seq > cursor + 3), "the ring never wrapped"
        got = await s.read(cursor)
        seqs = [t["seq"] for t in got["ticks"]]
        assert len(seqs) <= 5 and seqs == sorted(seqs)
        assert got["missed_ticks"] == got["first_seq"] - 1 - cursor > 0
        assert s.evicted_ticks >= got["missed_ticks"]
        caught_up = await s.read(got["last_seq"])
        assert caught_up["missed_ticks"] == 0
        assert all(t["seq"] > got["last_seq"] for t in caught_up["ticks"])
        await s.stop()

    asyncio.run(scenario())
