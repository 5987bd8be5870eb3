"""``phaselens collect`` (the real CLI, same arguments) whose store writes fail with
``OSError(ENOSPC)`` while the file named by ``$PHASELENS_TEST_DISK_FULL`` exists: a full disk where
the test cannot mount a small one (tests/collector/test_disk_full.py). The failure is injected at
``collector.store.flushing._insert``, the one place where the store writes rows to DuckDB.

    python -m tests.collector.enospc_collect collect --db ... --serving ...
"""

from __future__ import annotations

import errno
import os
import sys
from pathlib import Path
from typing import Any

from collector.store import flushing as store
from phaselens import cli

FLAG_ENV = "PHASELENS_TEST_DISK_FULL"


def main() -> int:
    flag = Path(os.environ[FLAG_ENV])
    insert = store._insert

    def full_disk_insert(con: Any, table: str, parts: list[Any]) -> None:
        if flag.exists():
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(flag))
        insert(con, table, parts)

    store._insert = full_disk_insert  # type: ignore[assignment]
    return cli.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
