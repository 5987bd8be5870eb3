"""``phaselens demo``: the whole system on this machine with one command, supervised.

A supervisor (this process) starts each part as a child process and watches it:

- ``phaselens serve``: the bundled stack, disaggregated 1 prefill + 1 decode worker, on the GPUs NVML
  finds (``cuda``) or else on emulated H100s pacing the tiny model's math to a Llama-3.1-8B shape;
- ``phaselens collect``: the DuckDB store's only writer (``--db``, default ``phaselens-demo.duckdb``),
  reading the stack, with the report scheduler on and a control token made for this run;
- ``streamlit run dashboard/app.py``: the dashboard, reading the collector;
- a replay of the Azure conversation trace at a rate this machine sustains: ``phaselens load`` passes
  over successive windows of the trace, looping back to its start;
- ``phaselens simulate --collector URL --token T``: a simulated fleet scenario (Llama-3.1-70B on
  8 × H100, the vendored 2,000-request trace slice) merged through the collector, once per store.

Every server binds 127.0.0.1. Each child writes its output to a log file (``--log-dir``). Progress
lines are printed as each part answers its health endpoint, then the URLs. A long-running child
that dies is restarted with back-off (1 s doubling to 30 s) and counted; one that dies before it
ever came up ends the demo with its log's last lines. SIGINT (Ctrl-C) and SIGTERM stop every child:
terminate, wait, kill its process group after a timeout; children also get SIGTERM should this
supervisor die (Linux ``PR_SET_PDEATHSIG``). A second run on the same store reuses it: the stored
rows stay, and a scenario already there is not simulated again.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

import httpx

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_APP = ROOT / "dashboard" / "app.py"

DEFAULT_DB = "phaselens-demo.duckdb"
SIM_MODEL = "llama-3.1-70b"
SIM_LAYOUT = "agg:8xh100-sxm:tp2"
# The vendored slice is the first 2,000 requests (≈ 7.3 minutes) of the Azure conversation trace;
# 8 × H100 simulate it in a few seconds and the store takes it in well under a minute on 2 cores.
SIM_REQUESTS = 2000
REPLAY_WINDOW_S = 60.0  # trace seconds per `phaselens load` pass
TRACE_SPAN_S = 430.0  # the vendored slice's span (its last arrival ≈ 438 s), where the replay wraps
START_TIMEOUT_S = 240.0
RESTART_DELAY_S = 1.0
MAX_RESTART_DELAY_S = 30.0


class DemoError(Exception):
    """The demo cannot start or go on; the message says which part and what to do."""


def _pdeathsig() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Have the kernel send SIGTERM to this child when the supervisor dies (Linux only)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


@dataclass
class Child:
    """One supervised child process: how to start it, where it logs, how it is checked and stopped.

    ``kind`` is ``service`` (kept running, restarted on death), ``loop`` (started again when it ends:
    exit 0 is a finished pass, anything else a failure with back-off) or ``once`` (runs to its end).
    ``argv`` takes the pass number (0, 1, ...) so a loop can move on through its input.
    """

    name: str
    argv: Callable[[int], list[str]]
    log_path: Path
    kind: str = "service"
    health_url: str | None = None
    env: dict[str, str] | None = None
    stop_signal: int = signal.SIGINT
    stop_timeout_s: float = 20.0
    proc: subprocess.Popen | None = None
    passes: int = 0  # starts so far
    deaths: int = 0  # unexpected exits (non-zero, or any exit of a service)
    restarts: int = 0
    healthy: bool = False  # answered its health endpoint at least once (or has none)
    next_start_s: float | None = None
    delay_s: float = RESTART_DELAY_S
    pids: set[int] = field(default_factory=set)
    log_offset: int = 0  # where this start's lines begin in the log
    started_s: float = 0.0  # time.monotonic() of the latest start
    _log: TextIO | None = None

    def start(self) -> None:
        """Start the process (in a session of its own: a terminal's Ctrl-C reaches only the supervisor,
        which stops the children in order)."""
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(self.log_path, "a", encoding="utf-8")  # noqa: SIM115 - kept open while it runs
        argv = self.argv(self.passes)
        self.log_offset = self._log.tell()
        self._log.write(f"\n==== {time.strftime('%Y-%m-%d %H:%M:%S')} {' '.join(argv)}\n")
        self._log.flush()
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=self.env,
            cwd=ROOT,
            start_new_session=True,
            preexec_fn=_pdeathsig if sys.platform.startswith("linux") else None,
        )
        self.started_s = time.monotonic()
        self.pids.add(self.proc.pid)
        self.passes += 1
        self.next_start_s = None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def returncode(self) -> int | None:
        return None if self.proc is None else self.proc.poll()

    def log_tail(self, lines: int = 15) -> str:
        """The last lines the child wrote to its log since its latest start."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.log_offset)
                text = f.read().decode("utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join("    " + line for line in text.rstrip().splitlines()[-lines:])

    def is_healthy(self) -> bool:
        """True when its health endpoint answers 200 (always, for a child without one)."""
        if self.health_url is None:
            return True
        try:
            return httpx.get(self.health_url, timeout=2.0).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        """Ask it to stop (its stop signal), wait ``stop_timeout_s``, then kill its process group."""
        proc = self.proc
        if proc is None:
            return
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(self.stop_signal)
            try:
                proc.wait(timeout=self.stop_timeout_s)
            except subprocess.TimeoutExpired:
                print(
                    f"phaselens demo: {self.name} did not stop within {self.stop_timeout_s:g} s; killing it",
                    file=sys.stderr,
                    flush=True,
                )
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
        _reap_group(proc.pid)
        if self._log is not None:
            self._log.close()
            self._log = None


def _reap_group(pgid: int, grace_s: float = 5.0) -> None:
    """Wait for what is left of a stopped child's process group (its own children), then kill it."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.1)
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def port_error(port: int, what: str, flag: str) -> str | None:
    """A message when ``port`` on 127.0.0.1 cannot be bound, else None."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return f"port {port} ({what}) on 127.0.0.1 is in use; choose another with {flag} PORT"
            return (
                f"cannot listen on 127.0.0.1:{port} ({what}): {e.strerror or e}; change it with {flag} PORT"
            )
    return None


def serving_devices() -> tuple[str, str]:
    """The ``--device`` for the stack and how to say it: real GPUs where NVML finds them, else
    emulated H100s."""
    from serving.devices.nvml import nvml_device_count

    count = nvml_device_count()
    if count >= 2:
        return "cuda:0,cuda:1", "cuda:0 (prefill) and cuda:1 (decode), measured by NVML"
    if count == 1:
        return "cuda:0,cuda:0", "cuda:0 (prefill and decode worker on one GPU), measured by NVML"
    return "emulated:h100-sxm", "emulated H100s (no NVIDIA GPU found), modeling llama-3.1-8b"


@dataclass
class DemoPlan:
    """What the demo runs, from its options."""

    db: Path
    log_dir: Path
    serve_port: int
    collector_port: int
    dashboard_port: int
    device: str
    device_note: str
    token: str
    sim: bool
    dashboard: bool
    replay: bool
    replay_time_scale: float
    sim_requests: int
    exit_after_s: float | None

    @property
    def serve_url(self) -> str:
        return f"http://127.0.0.1:{self.serve_port}"

    @property
    def collector_url(self) -> str:
        return f"http://127.0.0.1:{self.collector_port}"

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.dashboard_port}"


def _phaselens(*args: str) -> list[str]:
    return [sys.executable, "-m", "phaselens.cli", *args]


def build_children(plan: DemoPlan, env: dict[str, str]) -> dict[str, Child]:
    """The demo's children by name, not started."""
    logs = plan.log_dir
    serve = ["serve", "--mode", "disaggregated", "--device", plan.device, "--port", str(plan.serve_port)]
    serve += ["--host", "127.0.0.1", "--kv-cache-mb", "64", "--threads-per-worker", "1"]
    if plan.device.startswith("emulated:"):
        serve += ["--emulate-shape", "llama-3.1-8b"]
    children = {
        "serving": Child(
            "serving",
            lambda _n: _phaselens(*serve),
            logs / "serving.log",
            health_url=f"{plan.serve_url}/health",
            env=env,
            stop_timeout_s=30.0,
        ),
        "collector": Child(
            "collector",
            lambda _n: _phaselens(
                "collect",
                "--db",
                str(plan.db),
                "--host",
                "127.0.0.1",
                "--port",
                str(plan.collector_port),
                "--serving",
                plan.serve_url,
            ),
            logs / "collector.log",
            health_url=f"{plan.collector_url}/health",
            env=env,
            stop_timeout_s=60.0,  # it flushes and checkpoints the store on the way out
        ),
    }
    if plan.dashboard:
        streamlit = [sys.executable, "-m", "streamlit", "run", str(DASHBOARD_APP), "--server.headless=true"]
        streamlit += ["--server.address=127.0.0.1", f"--server.port={plan.dashboard_port}"]
        streamlit += ["--browser.gatherUsageStats=false", "--server.fileWatcherType=none"]
        streamlit += ["--client.toolbarMode=viewer"]
        children["dashboard"] = Child(
            "dashboard",
            lambda _n: streamlit,
            logs / "dashboard.log",
            health_url=f"{plan.dashboard_url}/_stcore/health",
            env={**env, "PHASELENS_API_URL": plan.collector_url},
            stop_signal=signal.SIGTERM,
        )
    if plan.replay:
        children["replay"] = Child(
            "replay",
            lambda n: replay_argv(plan, n),
            logs / "replay.log",
            kind="loop",
            env=env,
            stop_signal=signal.SIGTERM,
            stop_timeout_s=10.0,
        )
    if plan.sim:
        # the control token reaches it in $PHASELENS_CONTROL_TOKEN (not in argv: ps shows argv)
        sim = ["simulate", "--collector", plan.collector_url, "--no-progress"]
        sim += ["--model", SIM_MODEL, "--layout", SIM_LAYOUT, "--limit", str(plan.sim_requests)]
        children["simulation"] = Child(
            "simulation",
            lambda _n: _phaselens(*sim),
            logs / "simulation.log",
            kind="once",
            env=env,
            stop_signal=signal.SIGTERM,
            stop_timeout_s=10.0,
        )
    return children


def replay_argv(plan: DemoPlan, n: int) -> list[str]:
    """Pass ``n`` of the replay: the next ``REPLAY_WINDOW_S`` of the trace, wrapping at its end."""
    windows = int(TRACE_SPAN_S // REPLAY_WINDOW_S)
    start_s = (n % windows) * REPLAY_WINDOW_S
    return _phaselens(
        "load",
        "--url",
        plan.serve_url,
        "--start",
        f"{start_s:g}",
        "--duration",
        f"{REPLAY_WINDOW_S:g}",
        "--time-scale",
        f"{plan.replay_time_scale:g}",
        "--max-prompt-tokens",
        "512",
        "--max-output-tokens",
        "48",
        "--max-failure-rate",
        "0.5",
        "--no-progress",
    )


def trace_span_text(requests: int) -> str:
    """How much traffic the first ``requests`` of the vendored trace are: ``≈ 7 minutes``, ``≈ 61 s``."""
    from serving.trace import load_azure_trace, vendored_trace_path

    span_s = load_azure_trace(vendored_trace_path(), limit=requests)[-1].arrival_s
    if span_s < 1:
        return "under a second"
    return f"≈ {span_s:.0f} s" if span_s < 90 else f"≈ {span_s / 60:.0f} minutes"


def stored_scenario(collector_url: str, requests: int) -> dict[str, Any] | None:
    """The demo's scenario when the store already holds it (same layout, model and trace length)."""
    r = httpx.get(f"{collector_url}/api/v1/scenarios", timeout=30)
    r.raise_for_status()
    for s in r.json()["scenarios"]:
        trace = s.get("trace") or {}
        if s.get("name") == SIM_LAYOUT and s.get("model") == SIM_MODEL and trace.get("requests") == requests:
            return s
    return None


class Supervisor:
    """Starts the children, reports progress, restarts what dies, stops everything on a signal."""

    def __init__(self, plan: DemoPlan, out: TextIO = sys.stderr) -> None:
        self.plan = plan
        self.out = out
        self.stopping = threading.Event()
        self.signal_name: str | None = None
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "PHASELENS_CONTROL_TOKEN": plan.token}
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH", "")) if p)
        self.children = build_children(plan, env)
        self.sim_started_s: float | None = None

    def say(self, message: str) -> None:
        print(f"phaselens demo: {message}", file=self.out, flush=True)

    def _on_signal(self, signum: int, _frame: Any) -> None:
        if self.stopping.is_set():  # a second Ctrl-C: no more waiting
            for child in self.children.values():
                child.stop_timeout_s = 0.5
            return
        self.signal_name = signal.Signals(signum).name
        self.stopping.set()

    def run(self) -> int:
        """Run until a signal or ``exit_after_s``; 0 after a clean stop, 1 when a part cannot come up."""
        old = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            try:
                self._start()
                self._supervise()
            except DemoError as e:
                self.say(f"error: {e}")
                return 1
            finally:
                self._stop_all()
            return 0
        finally:
            for s, handler in old.items():
                signal.signal(s, handler)

    # -- start -------------------------------------------------------------------------------------

    def _start(self) -> None:
        plan = self.plan
        state = "reused: its rows stay" if plan.db.exists() else "new"
        self.say(f"store {plan.db} ({state}); logs in {plan.log_dir}/")
        self.say(f"starting the serving stack (1 prefill + 1 decode worker on {plan.device_note})")
        self.children["serving"].start()
        if "dashboard" in self.children:
            self.say("starting the dashboard")
            self.children["dashboard"].start()
        # the collector after the stack is up: started earlier, it would record its first polls of a
        # stack not yet listening as ingest errors
        self._wait_healthy([self.children["serving"]])
        if self.stopping.is_set():
            return
        self.say("starting the collector (report scheduler on)")
        self.children["collector"].start()
        self._wait_healthy([c for c in self.children.values() if c.kind == "service" and not c.healthy])
        if self.stopping.is_set():
            return
        if "simulation" in self.children:
            self._start_simulation()
        if "replay" in self.children:
            rate = 4.6 / plan.replay_time_scale
            self.say(
                f"replaying the Azure conversation trace at {1 / plan.replay_time_scale:g}x its pace "
                f"(≈ {rate:.1f} req/s; prompts clipped to 512 tokens, outputs to 48), "
                f"{REPLAY_WINDOW_S:g} trace seconds per pass, looping"
            )
            self.children["replay"].start()
        self.say("up:")
        if "dashboard" in self.children:
            self.say(f"  dashboard      {plan.dashboard_url}")
        self.say(f"  collector API  {plan.collector_url}  (/health, /api/v1/...)")
        self.say(f"  serving API    {plan.serve_url}/v1  (OpenAI-compatible; /metrics, /health)")
        self.say(f"  control token  {plan.token}  (this run's bearer token of /control and /api/v1/import)")
        until = f"for {plan.exit_after_s:g} s" if plan.exit_after_s is not None else "until Ctrl-C"
        self.say(f"running {until}")

    def _wait_healthy(self, children: list[Child]) -> None:
        """Wait until ``children`` answer their health endpoints. Each is said up with the time since
        its own start; another started service seen up meanwhile (the dashboard, while the stack
        loads) is said up then, not when its own wait comes."""
        start = time.monotonic()
        next_note = start + 10.0
        waiting = list(children)
        while waiting and not self.stopping.is_set():
            for other in self.children.values():
                unseen = other.kind == "service" and not other.healthy and other not in waiting
                if unseen and other.running() and other.is_healthy():
                    other.healthy = True
                    self.say(f"{other.name} is up ({time.monotonic() - other.started_s:.1f} s)")
            for child in list(waiting):
                code = child.returncode()
                if code is not None:
                    raise DemoError(
                        f"{child.name} exited with code {code} before it came up; "
                        f"the end of {child.log_path}:\n{child.log_tail()}"
                    )
                if child.is_healthy():
                    child.healthy = True
                    waiting.remove(child)
                    self.say(f"{child.name} is up ({time.monotonic() - child.started_s:.1f} s)")
            now = time.monotonic()
            if waiting and now - start > START_TIMEOUT_S:
                names = ", ".join(f"{c.name} ({c.health_url})" for c in waiting)
                raise DemoError(
                    f"not up after {START_TIMEOUT_S:g} s: {names}; see the logs in {self.plan.log_dir}/"
                )
            if waiting and now >= next_note:
                self.say(f"waiting for {', '.join(c.name for c in waiting)} ({now - start:.0f} s)")
                next_note = now + 10.0
            self.stopping.wait(0.3)

    def _start_simulation(self) -> None:
        plan = self.plan
        try:
            existing = stored_scenario(plan.collector_url, plan.sim_requests)
        except (httpx.HTTPError, KeyError, ValueError) as e:
            self.say(f"simulation skipped: the collector's scenario list failed: {e}")
            self.children.pop("simulation")
            return
        if existing is not None:
            self.say(
                f"simulated scenario {existing['scenario_id']} ({SIM_MODEL} on {SIM_LAYOUT}) is already in "
                f"the store; not simulated again: {plan.dashboard_url}/?dataset={existing['scenario_id']}"
            )
            self.children.pop("simulation")
            return
        self.say(
            f"simulating {SIM_MODEL} on 8 × H100 ({SIM_LAYOUT}) for the first {plan.sim_requests:,} requests "
            f"of the trace ({trace_span_text(plan.sim_requests)} of traffic) in the background; labelled "
            "simulated, about a minute"
        )
        self.sim_started_s = time.monotonic()
        self.children["simulation"].start()

    # -- supervise ---------------------------------------------------------------------------------

    def _supervise(self) -> None:
        deadline = None if self.plan.exit_after_s is None else time.monotonic() + self.plan.exit_after_s
        while not self.stopping.is_set():
            if deadline is not None and time.monotonic() >= deadline:
                self.say(f"--exit-after {self.plan.exit_after_s:g} s reached")
                return
            for child in self.children.values():
                self._check(child)
            self.stopping.wait(0.5)

    def _check(self, child: Child) -> None:
        now = time.monotonic()
        if child.proc is None or child.next_start_s is not None:
            if child.next_start_s is not None and now >= child.next_start_s:
                if child.kind == "service":
                    child.restarts += 1
                child.start()
            return
        code = child.returncode()
        if code is None:
            if child.kind == "service" and not child.healthy and child.is_healthy():
                child.healthy = True
                self.say(f"{child.name} is up again (restart {child.restarts})")
            return
        if child.kind == "once":
            self._simulation_done(child, code)
            child.stop()  # closes its log
            child.proc = None
            child.kind = "done"
            return
        if child.kind == "done":
            return
        if child.kind == "loop" and code == 0:
            child.delay_s = RESTART_DELAY_S
            child.next_start_s = now
            return
        child.deaths += 1
        child.healthy = False
        _reap_group(child.proc.pid, grace_s=2.0)  # what it left behind (a dead router's workers)
        what = "pass failed" if child.kind == "loop" else "died"
        self.say(
            f"{child.name} {what} (exit code {code}; {child.deaths} so far); starting it again in "
            f"{child.delay_s:g} s. The end of {child.log_path}:\n{child.log_tail(6)}"
        )
        child.next_start_s = now + child.delay_s
        child.delay_s = min(child.delay_s * 2, MAX_RESTART_DELAY_S)

    def _simulation_done(self, child: Child, code: int) -> None:
        took = time.monotonic() - (self.sim_started_s or time.monotonic())
        if code != 0:
            self.say(
                f"simulation failed (exit code {code}) after {took:.0f} s; the live parts go on. "
                f"The end of {child.log_path}:\n{child.log_tail(8)}"
            )
            return
        try:
            scenario = stored_scenario(self.plan.collector_url, self.plan.sim_requests)
        except (httpx.HTTPError, KeyError, ValueError):
            scenario = None
        where = f": {self.plan.dashboard_url}/?dataset={scenario['scenario_id']}" if scenario else ""
        self.say(f"simulated scenario stored in {took:.0f} s (labelled simulated){where}")

    # -- stop --------------------------------------------------------------------------------------

    def _stop_all(self) -> None:
        # the load first, the stack last: the collector reads the stack until it has flushed the store
        order = ["replay", "simulation", "dashboard", "collector", "serving"]
        started = [
            self.children[n] for n in order if n in self.children and self.children[n].proc is not None
        ]
        if not started:
            return
        why = f"{self.signal_name} received; " if self.signal_name else ""
        self.say(f"{why}stopping {', '.join(c.name for c in started)}")
        for child in started:
            child.stop()
        counts = [f"{c.name} {c.restarts}" for c in self.children.values() if c.restarts]
        note = f" (restarts: {', '.join(counts)})" if counts else ""
        kept = f"; the store {self.plan.db} is kept for the next run" if self.plan.db.exists() else ""
        self.say(f"stopped{note}{kept}")
