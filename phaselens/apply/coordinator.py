"""One apply at a time in the service: the API and the auto-apply policy both start applies here; the
plan is made (and its rows written) at once, the steps and guard windows run on a background thread.
A job of the collector (:meth:`collector.service.Collector.add_job`): stopping the service stops a
running apply between checks (a guard window in progress ends and the applied steps are rolled back).
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from phaselens.apply.audit import Audit
from phaselens.apply.plan import ApplyError
from phaselens.apply.runner import ApplyOptions, ApplyRun, rollback_apply

log = logging.getLogger(__name__)


class ApplyBusy(ApplyError):
    """Another apply (or rollback) is running (HTTP 409)."""

    def __init__(self, message: str) -> None:
        super().__init__(message, 409)


class ApplyCoordinator:
    """Starts applies and rollbacks one at a time; keeps the running one's progress and the last outcome."""

    def __init__(self, audit: Audit, token: str | None, allowed_urls: list[str] | None = None) -> None:
        self.audit, self.token, self.allowed_urls = audit, token, allowed_urls
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._run: ApplyRun | None = None
        self._thread: threading.Thread | None = None
        self._busy_with: str | None = None
        self.last: dict[str, Any] | None = None

    def start(self) -> None:
        pass

    def stop(self) -> None:
        """End a running apply (rolled back) and wait for it (bounded by its drain timeout)."""
        self._stop.set()
        t = self._thread
        if t is not None:
            t.join(timeout=300)

    @property
    def busy(self) -> bool:
        return self._busy_with is not None

    def progress(self) -> dict[str, Any] | None:
        """The running apply's progress (None when idle)."""
        run = self._run
        return run.progress.as_dict() if run is not None and self.busy else None

    def _claim(self, what: str) -> None:
        with self._lock:
            if self._busy_with is not None:
                raise ApplyBusy(
                    f"{self._busy_with} is running; one apply or rollback at a time: try again after it"
                )
            if self._stop.is_set():
                raise ApplyBusy("the service is stopping")
            self._busy_with = what

    def _release(self) -> None:
        with self._lock:
            self._busy_with = None

    def apply(self, rec_id: str, options: ApplyOptions, *, wait: bool = False) -> dict[str, Any]:
        """Plan ``rec_id`` and write its rows; a dry run ends there, an execution goes on in the
        background (``wait``: here). The plan's summary."""
        self._claim(f"the apply of {rec_id}")
        try:
            run = ApplyRun(
                self.audit, rec_id, self.token, options, stop=self._stop, allowed_urls=self.allowed_urls
            )
            summary = run.prepare()
        except BaseException:
            self._release()
            raise
        if not options.execute:
            self._release()
            self.last = run.run()
            return summary
        self._run = run

        def go() -> None:
            try:
                self.last = run.run()
            except Exception as e:
                log.exception("apply of %s failed", rec_id)
                self.last = {
                    "outcome": "error",
                    "recommendation_id": rec_id,
                    "error": f"{type(e).__name__}: {e}",
                }
            finally:
                self._release()

        if wait:
            go()
            return self.last or summary
        self._thread = threading.Thread(target=go, name=f"apply-{rec_id}", daemon=True)
        self._thread.start()
        return summary

    def join(self, timeout_s: float = 600.0) -> None:
        """Wait for the apply running in the background (if any)."""
        t = self._thread
        if t is not None:
            t.join(timeout=timeout_s)

    def rollback(self, ref: str, options: ApplyOptions) -> dict[str, Any]:
        """Restore the layout from before an apply (``ref``: an action or recommendation id)."""
        self._claim(f"the rollback of {ref}")
        try:
            return rollback_apply(self.audit, ref, self.token, options)
        finally:
            self._release()
