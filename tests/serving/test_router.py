"""The router app in-process, without workers: error handling that needs no running pool."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient

from serving.router import create_app
from serving.settings import ServeSettings


@pytest.fixture(scope="module")
def client() -> TestClient:
    app = create_app(ServeSettings(control_token="t"))

    @app.get("/v1/boom")
    async def boom() -> None:  # a probe route: what any handler's unexpected error looks like
        raise RuntimeError("unexpected")

    return TestClient(app, raise_server_exceptions=False)  # no lifespan: no worker processes


def test_unexpected_error_is_a_json_500(client: TestClient) -> None:
    r = client.get("/v1/boom")
    assert r.status_code == 500
    assert r.json() == {
        "error": {
            "message": "internal server error: RuntimeError",
            "type": "server_error",
            "param": None,
            "code": 500,
        }
    }


def test_no_pool_yet_is_a_json_503(client: TestClient) -> None:
    r = client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
    assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"


@pytest.mark.parametrize(
    ("method", "path", "status"),
    [("GET", "/v1/completions", 405), ("GET", "/v1/nope", 404), ("POST", "/v1/models", 405)],
)
def test_routing_errors_use_the_openai_error_shape(
    client: TestClient, method: str, path: str, status: int
) -> None:
    r = client.request(method, path)
    assert r.status_code == status
    assert r.json()["error"]["code"] == status and r.json()["error"]["message"]


def test_bad_query_parameter_is_a_400_naming_it(client: TestClient) -> None:
    r = client.get("/v1/telemetry", params={"limit": "abc"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "limit"


def test_control_api_errors_use_the_openai_shape(client: TestClient) -> None:
    r = client.get("/control/layout")
    err = r.json()["error"]
    assert r.status_code == 401 and err["code"] == 401 and err["type"] == "authentication_error"
    assert "bearer token" in err["message"]
