"""The bundled serving stack as the apply layer sees it: its control API (bearer token) and what the
guard reads — the router's request telemetry (``GET /v1/telemetry``: one event per finished request
with its token times and status) and the emulated devices' energy counters (``GET /v1/devices``).

Both reads need no token and are the same from the CLI and from the service, which is why the guard
uses them rather than the collector's store (the CLI may run with no collector at all).
"""

from __future__ import annotations

from typing import Any

import httpx

from serving.telemetry import TelemetryReader


class StackError(RuntimeError):
    """The stack refused a change or could not be reached; ``status`` is its HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0) -> None:
        super().__init__(message)
        self.status = status


def _message(r: httpx.Response) -> str:
    try:
        body = r.json()
        err = body.get("error") or body.get("detail") or {}
        return str(err.get("message", r.text[:300]) if isinstance(err, dict) else err)
    except ValueError:
        return r.text[:300]


class StackClient:
    """HTTP client of one router: ``/control/...`` with the bearer token, telemetry and devices."""

    def __init__(self, url: str, token: str, *, timeout_s: float = 180.0) -> None:
        self.url = url.rstrip("/")
        self._client = httpx.Client(
            base_url=self.url,
            headers={"Authorization": f"Bearer {token}"},
            timeout=httpx.Timeout(timeout_s, connect=5.0),
        )
        self._reader = TelemetryReader()

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> StackClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            r = self._client.request(method, path, **kw)
        except httpx.HTTPError as e:
            raise StackError(f"cannot reach the serving stack at {self.url} ({type(e).__name__}: {e})") from e
        if r.status_code == 401:
            raise StackError(
                f"{self.url}{path} refused the control token (401): pass the stack's control token with "
                "--token TOKEN or $PHASELENS_CONTROL_TOKEN",
                401,
            )
        if r.status_code >= 400:
            raise StackError(
                f"{method} {self.url}{path} answered {r.status_code}: {_message(r)}", r.status_code
            )
        return r.json()

    # -- control API -------------------------------------------------------------------------------

    def layout(self) -> dict[str, Any]:
        """``GET /control/layout``: every worker (id, role, state, device) and the pool's status."""
        return self._call("GET", "/control/layout")

    def add_worker(self, role: str) -> dict[str, Any]:
        """Start a worker of ``role`` (a copy of the pool's model and device settings); its description."""
        return self._call("POST", "/control/workers", json={"role": role})

    def set_role(self, worker_id: str, role: str, drain_timeout_s: float) -> dict[str, Any]:
        """Drain ``worker_id`` and give it ``role`` (the control API refuses stranding the pool)."""
        return self._call(
            "POST", f"/control/workers/{worker_id}/role", json={"role": role, "timeout_s": drain_timeout_s}
        )

    def remove_worker(self, worker_id: str, drain_timeout_s: float) -> dict[str, Any]:
        """Drain ``worker_id`` and stop it; the layout after."""
        return self._call("DELETE", f"/control/workers/{worker_id}", params={"timeout_s": drain_timeout_s})

    def device_knobs(self, worker_id: str) -> dict[str, Any]:
        """``GET /control/workers/{id}/device``: the knobs now and their bounds (``Device.knobs``)."""
        return self._call("GET", f"/control/workers/{worker_id}/device")

    def set_device(self, worker_id: str, body: dict[str, Any]) -> dict[str, Any]:
        """``POST /control/workers/{id}/device`` (``power_limit_w``, ``sm_clock_min_mhz``/``max``,
        ``reset``); the knobs after. The device refuses what is outside its bounds (400) and a GPU
        without root refuses any change (403)."""
        return self._call("POST", f"/control/workers/{worker_id}/device", json=body)

    # -- what the guard reads ----------------------------------------------------------------------

    def request_events(self) -> list[dict[str, Any]]:
        """The request events the router published since the last call (the first call: all it holds)."""
        out: list[dict[str, Any]] = []
        while True:
            params: dict[str, Any] = {"limit": 1000}
            if self._reader.cursors:
                params["after"] = self._reader.query_param()
            got = self._call("GET", "/v1/telemetry", params=params)
            fresh = self._reader.accept(got)
            if not fresh:
                return out
            out += [ev for b in fresh for ev in b["events"] if ev.get("type") == "request"]

    def counters(self) -> dict[str, dict[str, float]]:
        """By worker: its device's energy counter (``energy_j``) and, emulated, its iterations and
        the lagged ones (the host could not keep pace: ``iterations``, ``lagged``) and its modelled
        GPU seconds (``modeled_s``)."""
        body = self._call("GET", "/v1/devices")
        out: dict[str, dict[str, float]] = {}
        for d in body.get("devices", []):
            sample, emu = d.get("sample") or {}, d.get("emulation") or {}
            item: dict[str, float] = {}
            if sample.get("energy_mj") is not None:
                item["energy_j"] = float(sample["energy_mj"]) / 1000.0
            if emu:
                item["iterations"] = float(emu.get("iterations") or 0)
                item["lagged"] = float(emu.get("lagged_iterations") or 0)
                if emu.get("modeled_s_total") is not None:
                    item["modeled_s"] = float(emu["modeled_s_total"])
            out[d["worker"]] = item
        return out
