"""Fixtures shared across packages: one ``phaselens demo`` (the real CLI as a subprocess) for the demo
tests (tests/phaselens/test_demo.py) and the browser tests (tests/dashboard/test_browser.py), and one
collector on a simulated fleet (``fleet``) for the dashboard and collector API tests. Each stops its
processes after the last test that uses it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.collector.conftest import start_collector

ROOT = Path(__file__).resolve().parents[1]
# Every collector the tests start (start_collector, the demo's, the fleet's, `phaselens collect` run
# by a test) inherits this: no Overview computed ahead at its start (phaselens/summary_warm.py), CPU
# no test asks for. The tests of the warm-up set it on; PHASELENS_SUMMARY_WARM=on runs them all warm.
os.environ.setdefault("PHASELENS_SUMMARY_WARM", "off")
SIM_REQUESTS = 200  # the demo's simulated scenario, kept short for the tests


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class DemoRun:
    """`phaselens demo` on free ports and a temporary store; started again on the same store (and
    ports) after a stop, as a user's second run would be."""

    def __init__(self, workdir: Path) -> None:
        self.db = workdir / "demo.duckdb"
        self.serve_port, self.collector_port, self.dashboard_port = (_free_port() for _ in range(3))
        self.proc: subprocess.Popen | None = None
        self.runs: list[list[str]] = []  # each run's output lines
        self._reader: threading.Thread | None = None

    @property
    def serve_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_port}"

    @property
    def collector_url(self) -> str:
        return f"http://127.0.0.1:{self.collector_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"

    @property
    def output(self) -> str:
        """The current (last) run's output."""
        return "\n".join(self.runs[-1]) if self.runs else ""

    @property
    def token(self) -> str:
        """The current run's control token, as the demo prints it."""
        for line in reversed(self.runs[-1] if self.runs else []):
            if "control token" in line:
                return line.split("control token", 1)[1].split()[0]
        raise AssertionError(f"the demo printed no control token:\n{self.output}")

    def command(self) -> list[str]:
        return [
            sys.executable,
            "-m",
            "phaselens.cli",
            "demo",
            "--db",
            str(self.db),
            "--serve-port",
            str(self.serve_port),
            "--collector-port",
            str(self.collector_port),
            "--dashboard-port",
            str(self.dashboard_port),
            "--sim-requests",
            str(SIM_REQUESTS),
            "--replay-time-scale",
            "2",
        ]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout_s: float = 300.0) -> None:
        """Start a run and wait until it says it is up (every part answered its health check)."""
        lines: list[str] = []
        self.runs.append(lines)
        self.proc = subprocess.Popen(
            self.command(), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        proc = self.proc

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line.rstrip("\n"))

        self._reader = threading.Thread(target=read, daemon=True)
        self._reader.start()
        self.wait_for("phaselens demo: running until Ctrl-C", timeout_s)

    def ensure_up(self) -> DemoRun:
        if not self.running():
            self.start()
        return self

    def wait_for(self, text: str, timeout_s: float) -> None:
        """Wait until the current run prints ``text``; fail with its output when it exits first."""
        deadline = time.monotonic() + timeout_s
        while text not in self.output:
            if self.proc is not None and self.proc.poll() is not None:
                time.sleep(0.5)  # the last lines
                raise AssertionError(
                    f"the demo exited ({self.proc.returncode}) before {text!r}:\n{self.output}"
                )
            if time.monotonic() > deadline:
                raise AssertionError(f"no {text!r} within {timeout_s:g} s:\n{self.output}")
            time.sleep(0.2)

    def stop(self, sig: int = signal.SIGINT, timeout_s: float = 150.0) -> int:
        """Send ``sig`` and wait for the demo to exit; its exit status."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        if self._reader is not None:
            self._reader.join(timeout=10)
        return self.proc.returncode

    def count(self, table: str, **params: float | str) -> int:
        """Rows of ``table`` through the collector's API (up to 100,000)."""
        r = httpx.get(
            f"{self.collector_url}/api/v1/tables/{table}", params={"limit": 100_000, **params}, timeout=60
        )
        assert r.status_code == 200, r.text
        return len(r.json()["rows"])

    def scenarios(self) -> list[dict]:
        r = httpx.get(f"{self.collector_url}/api/v1/scenarios", timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["scenarios"]

    def wait_for_scenario(self, timeout_s: float = 180.0) -> dict:
        """The demo's simulated scenario, once the collector has merged it."""
        deadline = time.monotonic() + timeout_s
        while True:
            found = self.scenarios()
            if found:
                return found[0]
            if time.monotonic() > deadline:
                raise AssertionError(f"no simulated scenario within {timeout_s:g} s:\n{self.output}")
            time.sleep(1.0)


# Session fixtures that keep processes running (the demo, the fleet's collector) stop them after the
# last test that uses them, not at the session's end: left running, the demo's replay load and
# workers took ~half a core from every later test on a 2-core host (timing-bound ones skipped).
_LAST_USER: dict[str, str] = {}  # fixture name -> node id of the last test (of this run) using it
_STOPPERS: dict[str, Callable[[], object]] = {}


def stop_after_last_use(name: str, stop: Callable[[], object]) -> None:
    """Call ``stop`` after the last test that uses the session fixture ``name`` (its finalizer still
    runs at the session's end: ``stop`` and it must both be safe to call twice)."""
    _STOPPERS[name] = stop


# Under pytest-xdist (scripts/test.sh: ``pytest -n 2 --dist loadgroup``) each test file runs whole on
# one worker (its module fixtures start once), and the files that share one of these session or
# package fixtures (the same definition: tests/phaselens/apply's ``stack`` is not power's) run together
# on one worker: the fixture starts once, and its last user (stop_after_last_use) is the last test on
# that worker that uses it.
SHARED_SESSION_FIXTURES = ("demo", "fleet", "simulated", "stack")
# Fixtures that run processes (a stack, a collector, the demo, Chromium): a group using them is
# heavy and is handed out first (see _heaviest_groups_first), like the tests marked ``slow``.
PROCESS_FIXTURES = frozenset(
    {*SHARED_SESSION_FIXTURES, "browser", "server", "live", "external_fleet", "dashboard_env"}
)
# xdist 3.8's loadgroup puts the group into the node id (``item._nodeid``), which pytest 9.2 no longer
# reads (node ids come from ``item._id``): every test became its own group, module and session
# fixtures started on both workers. So the groups travel beside the node ids instead: each worker
# writes {node id: group} to a file named in its workerinput, and the controller's scheduler
# (_GroupScheduling) reads it.
_GROUPS_DIR = "phaselens_groups_dir"


def _definition(item: pytest.Item, name: str) -> Any:
    """The definition of the fixture ``name`` that ``item`` uses (None when it uses none)."""
    if name not in item.fixturenames:
        return None
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {}).get(name)
    return defs[-1] if defs else None


def _shared_fixture(item: pytest.Item, name: str) -> int | None:
    """Which definition of ``name`` ``item`` uses, when it is a session or package fixture."""
    found = _definition(item, name)
    return id(found) if found is not None and found.scope in ("session", "package") else None


def _weight(item: pytest.Item) -> int:
    """A rough cost for scheduling: 1 a test, 30 one that starts processes or is marked slow."""
    heavy = item.get_closest_marker("slow") is not None or not PROCESS_FIXTURES.isdisjoint(item.fixturenames)
    return 30 if heavy else 1


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Put each test in an ``xdist_group``: its file's, or that of the files sharing its session or
    package fixture; on an xdist worker, order the groups heaviest first and tell the controller."""
    group: dict[str, str] = {}  # file -> group name (union of files sharing a session fixture)

    def find(f: str) -> str:
        while group.get(f, f) != f:
            f = group[f]
        return f

    files = [item.nodeid.split("::", 1)[0] for item in items]
    for name in SHARED_SESSION_FIXTURES:
        users: dict[int, set[str]] = {}  # fixture definition -> files using it
        for f, item in zip(files, items, strict=True):
            if (key := _shared_fixture(item, name)) is not None:
                users.setdefault(key, set()).add(f)
        for same in users.values():
            first, *rest = sorted(same)
            for f in rest:
                group[find(f)] = find(first)
    names = [find(f) for f in files]
    for name, item in zip(names, items, strict=True):
        item.add_marker(pytest.mark.xdist_group(name))
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and workerinput.get(_GROUPS_DIR):
        groups = {item.nodeid: name for name, item in zip(names, items, strict=True)}
        # every worker sorts alike (the controller checks that they collected the same list)
        items[:] = _heaviest_groups_first(items, names)
        out = Path(workerinput[_GROUPS_DIR]) / f"{workerinput['workerid']}.json"
        out.write_text(json.dumps(groups))


def _heaviest_groups_first(items: list[pytest.Item], names: list[str]) -> list[pytest.Item]:
    """``items`` with whole groups sorted by their weight, heaviest first (each group's tests keep
    their order): the scheduler hands the groups out in this order, so the long ones do not come
    last and leave the other worker idle at the end."""
    weight: dict[str, int] = {}
    for name, item in zip(names, items, strict=True):
        weight[name] = weight.get(name, 0) + _weight(item)
    first_seen = {name: i for i, name in reversed(list(enumerate(names)))}
    order = sorted(range(len(items)), key=lambda i: (-weight[names[i]], first_seen[names[i]], i))
    return [items[i] for i in order]


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:
    """xdist controller: name the folder where the workers write their groups (see _GROUPS_DIR)."""
    if node.config.getvalue("dist") == "loadgroup":
        if not hasattr(node.config, "_phaselens_groups_dir"):
            node.config._phaselens_groups_dir = tempfile.mkdtemp(prefix="phaselens-xdist-groups-")
        node.workerinput[_GROUPS_DIR] = node.config._phaselens_groups_dir


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: our groups, in the order the workers put them (heaviest first)."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class _GroupScheduling(LoadScopeScheduling):
        def __init__(self, config: pytest.Config, log: Any) -> None:
            super().__init__(config, log)
            self.groups: dict[str, str] = {}

        def schedule(self) -> None:
            if self.collection is None and self.collection_is_completed:
                folder = Path(config._phaselens_groups_dir)
                found = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
                assert found and all(f == found[0] for f in found), "the workers' groups differ"
                self.groups = found[0]
                config.option.loadscopereorder = False  # keep the workers' order
            super().schedule()

        def _split_scope(self, nodeid: str) -> str:
            return self.groups.get(nodeid, nodeid)

    return _GroupScheduling(config, log)


def pytest_unconfigure(config: pytest.Config) -> None:
    folder = getattr(config, "_phaselens_groups_dir", None)
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def pytest_collection_finish(session: pytest.Session) -> None:
    for item in session.items:
        for name in getattr(item, "fixturenames", ()):
            # only this file's fixtures: tests/analytics/test_external.py has a module ``fleet`` of its
            # own, whose users (another xdist group) must not count as the session fleet's last user
            found = _definition(item, name)
            if found is not None and getattr(found.func, "__module__", None) == __name__:
                _LAST_USER[name] = item.nodeid


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    for name in [n for n, nodeid in _LAST_USER.items() if nodeid == item.nodeid and n in _STOPPERS]:
        _STOPPERS.pop(name)()


# Streamlit's AppTest (tests/dashboard) sets sys.modules["__main__"] to the page script it ran and
# leaves it there, also from module-scoped fixtures; a forkserver or spawn started later in this
# process (the serving stack's workers) would re-run that page in every child before its own code.
_REAL_MAIN = sys.modules["__main__"]


@pytest.fixture(autouse=True)
def _the_real_main_module() -> Iterator[None]:
    """Put the process's own ``__main__`` back around every test (see _REAL_MAIN)."""
    sys.modules["__main__"] = _REAL_MAIN
    yield
    sys.modules["__main__"] = _REAL_MAIN


@pytest.fixture(scope="session")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DemoRun]:
    """One demo for the session (started on first use; a test that stops it starts it again)."""
    run = DemoRun(tmp_path_factory.mktemp("demo"))
    stop_after_last_use("demo", lambda: run.running() and run.stop(signal.SIGTERM))
    try:
        yield run
    finally:
        if run.running():
            run.stop(signal.SIGTERM)


@dataclass(frozen=True)
class Fleet:
    """The collector's URL and its scenarios by layout name (``agg:2xh100-sxm``, ``1p1d:h100-sxm``)."""

    url: str
    scenarios: dict[str, str]


def stop_process(proc: subprocess.Popen) -> None:
    """Terminate ``proc`` and wait for it (killed after 20 s); safe on a process already ended."""
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="session")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    """`phaselens simulate --db` (an aggregated and a disaggregated 2-GPU layout, 100 requests),
    then `phaselens collect` on that store (the dashboard and collector API tests)."""
    db = tmp_path_factory.mktemp("dashboard") / "fleet.duckdb"
    sim = [
        sys.executable,
        "-m",
        "phaselens.cli",
        "simulate",
        "--no-progress",
        "--limit",
        "100",
        "--db",
        str(db),
    ]
    done = subprocess.run(
        [*sim, "--layout", "agg:2xh100-sxm", "--layout", "1p1d:h100-sxm"],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    # warm (PHASELENS_SUMMARY_WARM off for the others): its users ask for the Overview first, and the
    # head start it gets while the tests set up made two of its files 3 s faster (11 s, 14 s cold)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PHASELENS_SUMMARY_WARM", "on")
        proc, url = start_collector(db)
    stop_after_last_use("fleet", lambda: stop_process(proc))
    try:
        body = httpx.get(f"{url}/api/v1/scenarios", timeout=10).json()
        yield Fleet(url, {s["name"]: s["scenario_id"] for s in body["scenarios"]})
    finally:
        stop_process(proc)
