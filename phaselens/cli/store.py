"""``phaselens store export|import``: hive-partitioned Parquet exports of a store file."""

from __future__ import annotations

import argparse
import sys


def add_store_command(sub: argparse._SubParsersAction) -> None:
    """Register ``phaselens store`` on the CLI's subparsers."""
    store = sub.add_parser("store", help="export a store to Parquet (by date and node) or import exports")
    store.add_argument("action", choices=("export", "import"))
    store.add_argument("dir", help="the Parquet folder (hive-partitioned: <table>/date=.../node=...)")
    store.add_argument("--db", default="phaselens.duckdb")
    store.add_argument("--start", type=float, default=None, help="export from (UTC epoch s)")
    store.add_argument("--end", type=float, default=None, help="export until (UTC epoch s)")
    store.set_defaults(func=cmd_store)


def cmd_store(args: argparse.Namespace) -> int:
    """Export a store to hive-partitioned Parquet, or import such exports from other nodes.

    Works on the file directly, so the collector writing it must be stopped first (DuckDB admits
    one writing process; the error says so).
    """
    from collector.store import Store, StoreError, StoreLockedError, export_parquet, import_parquet

    try:
        with Store.open(args.db, read_only=args.action == "export") as store:
            if args.action == "export":
                res = export_parquet(store, args.dir, start=args.start, end=args.end)
                print(f"exported {sum(res.rows.values())} rows to {res.out_dir}: {res.rows}")
            else:
                res = import_parquet(store, args.dir)
                print(f"imported {res.inserted}; skipped duplicates {res.duplicates}")
    except (StoreError, OSError, ValueError) as e:
        hint = ""
        if isinstance(e, StoreLockedError) and args.action == "import":
            hint = (
                "; or have the running collector merge it: POST /api/v1/import with "
                '{"path": "<absolute export dir>"} and its control token (docs/STORE.md)'
            )
        print(f"phaselens store {args.action}: error: {e}{hint}", file=sys.stderr)
        return 2
    return 0
