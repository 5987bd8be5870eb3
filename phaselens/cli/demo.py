"""``phaselens demo``: its options, checked before anything starts; the run itself is
:class:`phaselens.demo.Supervisor`."""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path
from typing import Any

from phaselens.demo import DEFAULT_DB, SIM_REQUESTS, DemoPlan, Supervisor, port_error, serving_devices


def add_demo_command(sub: Any) -> None:
    """Register ``phaselens demo`` on the CLI's subparsers."""
    p = sub.add_parser(
        "demo",
        help="everything at once: serving stack, collector, trace replay, a simulated fleet, dashboard",
        description=(
            "Start the serving stack (real GPUs where NVML finds them, else emulated H100s), the "
            "collector with its DuckDB store, a looping replay of the Azure conversation trace, a "
            "simulated fleet scenario and the dashboard, all on 127.0.0.1; Ctrl-C stops them all."
        ),
    )
    p.add_argument("--db", default=DEFAULT_DB, help=f"the DuckDB store (default {DEFAULT_DB}; reused)")
    p.add_argument("--log-dir", default=None, help="children's logs (default: <db without .duckdb>-logs)")
    p.add_argument("--serve-port", type=int, default=8000, help="serving stack's port (8000)")
    p.add_argument("--collector-port", type=int, default=8900, help="collector API's port (8900)")
    p.add_argument("--dashboard-port", type=int, default=8501, help="dashboard's port (8501)")
    p.add_argument(
        "--device",
        default="auto",
        help="auto (NVML GPUs, else emulated:h100-sxm), or a `phaselens serve --device` value",
    )
    p.add_argument("--no-sim", action="store_true", help="no simulated fleet scenario")
    p.add_argument("--no-dashboard", action="store_true", help="no dashboard")
    p.add_argument("--no-replay", action="store_true", help="no trace replay")
    p.add_argument(
        "--replay-time-scale",
        type=float,
        default=4.0,
        help="trace time stretch of the replay (4: a quarter of the trace's ≈ 4.6 req/s)",
    )
    p.add_argument(
        "--sim-requests",
        type=int,
        default=SIM_REQUESTS,
        help=f"requests of the trace simulated ({SIM_REQUESTS:,}: the vendored slice, ≈ 7 minutes)",
    )
    p.add_argument(
        "--exit-after",
        "--duration",
        dest="exit_after",
        type=float,
        default=None,
        metavar="S",
        help="stop cleanly this many seconds after everything is up (default: run until Ctrl-C)",
    )
    p.set_defaults(func=cmd_demo)


def _error(message: str) -> int:
    print(f"phaselens demo: error: {message}", file=sys.stderr)
    return 2


def cmd_demo(args: argparse.Namespace) -> int:
    """Run ``phaselens demo``: 2 on bad options or a port in use (before anything starts), 1 when a part
    cannot come up, 0 after a clean stop."""
    ports = {
        "serving API": (args.serve_port, "--serve-port"),
        "collector API": (args.collector_port, "--collector-port"),
    }
    if not args.no_dashboard:
        ports["dashboard"] = (args.dashboard_port, "--dashboard-port")
    for port, flag in ports.values():
        if not 1 <= port <= 65535:
            return _error(f"{flag} must be in [1, 65535], got {port}")
    seen: dict[int, str] = {}
    for what, (port, flag) in ports.items():
        if port in seen:
            return _error(f"the {what} and the {seen[port]} both ask for port {port}; change {flag}")
        seen[port] = what
    if not 0.1 <= args.replay_time_scale <= 1000:
        return _error(f"--replay-time-scale must be in [0.1, 1000], got {args.replay_time_scale:g}")
    if not 1 <= args.sim_requests <= SIM_REQUESTS:
        return _error(f"--sim-requests must be in [1, {SIM_REQUESTS}] (the vendored trace slice)")
    if args.exit_after is not None and not 0 < args.exit_after <= 7 * 86_400:
        return _error(f"--exit-after must be in (0, 604800] s, got {args.exit_after:g}")
    db = Path(args.db).expanduser().resolve()
    if db.is_dir():
        return _error(f"--db {args.db} is a directory; give a DuckDB file path")
    if not db.parent.is_dir():
        return _error(f"--db {args.db}: the folder {db.parent} does not exist")
    if args.device != "auto":
        from serving.devices.errors import DeviceValueError
        from serving.devices.registry import parse_device_spec

        try:
            for spec in args.device.split(","):
                parse_device_spec(spec)
        except DeviceValueError as e:
            return _error(f"--device {args.device}: {e}; or auto")
    for what, (port, flag) in ports.items():
        message = port_error(port, what, flag)
        if message:
            return _error(message)
    if args.device == "auto":
        device, note = serving_devices()
    else:
        device, note = args.device, args.device
        if device.startswith("emulated:"):
            note = f"{device}, modeling llama-3.1-8b"
    stem = db.name[: -len(".duckdb")] if db.name.endswith(".duckdb") else db.name
    plan = DemoPlan(
        db=db,
        log_dir=Path(args.log_dir).resolve() if args.log_dir else db.parent / f"{stem}-logs",
        serve_port=args.serve_port,
        collector_port=args.collector_port,
        dashboard_port=args.dashboard_port,
        device=device,
        device_note=note,
        token=secrets.token_hex(16),  # hex: never starts with "-", which argparse would take for a flag
        sim=not args.no_sim,
        dashboard=not args.no_dashboard,
        replay=not args.no_replay,
        replay_time_scale=args.replay_time_scale,
        sim_requests=args.sim_requests,
        exit_after_s=args.exit_after,
    )
    return Supervisor(plan).run()
