"""What the API says of itself: every route documents its statuses with the OpenAI error
schema (and no 422, which it never sends); OPTIONS names a path's methods in `Allow`;
dates in query strings are ISO 8601, and a number (`0`) is a 400, not 1970."""
from __future__ import annotations

import pytest


ERROR_REF = "#/components/schemas/ErrorResponse"


def error_statuses(operation: dict) -> set[int]:
    return {int(code) for code, response in operation["responses"].items()
            if response.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref") == ERROR_REF}


def test_every_route_documents_its_errors_in_the_openai_shape(api):
    with api.client() as client:
        schema = client.get("/openapi.json").json()
    assert set(schema["components"]["schemas"]["ErrorResponse"]["properties"]) == {"error"}
    operations = {(method.upper(), path): op for path, item in schema["paths"].items() for method, op in item.items()}
    assert len(operations) > 30
    for (method, path), operation in operations.items():
        assert "422" not in operation["responses"], (method, path)
        assert 500 in error_statuses(operation), (method, path)
        if path.startswith("/v1/"):
            assert {400, 401, 403} <= error_statuses(operation), (method, path)
        if "{" in path:
            assert 404 in error_statuses(operation), (method, path)
    for route in ("/v1/chat/completions", "/v1/completions", "/v1/generations"):
        op = operations["POST", route]
        assert {404, 409, 410, 413, 429, 503, 504} <= error_statuses(op), route
        assert set(op["responses"]["200"]["content"]) == {"application/json", "text/event-stream"}
    assert {413} <= error_statuses(operations["POST", "/v1/files"])
    assert {409} <= error_statuses(operations["POST", "/v1/batches/{batch_id}/cancel"])
    assert {409} <= error_statuses(operations["POST", "/v1/admin/tenants"])
    assert "503" in operations["GET", "/readyz"]["responses"]


def test_options_answers_with_allow(api):
    with api.client() as client:
        chat = client.options("/v1/chat/completions")
        assert chat.status_code == 204 and chat.headers["allow"] == "OPTIONS, POST"
        one = client.options("/v1/generations/gen_123")
        assert one.status_code == 204 and one.headers["allow"] == "GET, OPTIONS"
        limits = client.options("/v1/admin/tenants/t1/limits")
        assert set(limits.headers["allow"].split(", ")) == {"PATCH", "PUT", "OPTIONS"}
        missing = client.options("/v1/nothing-here")
        assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
        wrong = client.delete("/v1/chat/completions")
        assert wrong.status_code == 405 and wrong.headers["allow"] == "POST"


@pytest.mark.parametrize("path,param", [("/v1/usage?start_date=0", "start_date"), ("/v1/usage?end_date=0", "end_date"),
                                        ("/v1/audit/events?since=0", "since"), ("/v1/audit/events?until=0", "until"),
                                        ("/v1/audit/events?since=1700000000", "since"),
                                        ("/v1/usage?start_date=1e3", "start_date")])
def test_a_number_is_not_a_date(api, path, param):
    _, secret = api.tenant(scopes=("usage", "audit"))
    with api.client(secret) as client:
        response = client.get(path)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["param"] == param and "ISO 8601" in response.json()["error"]["message"]


def test_iso_dates_are_taken(api):
    _, secret = api.tenant(scopes=("usage", "audit"))
    with api.client(secret) as client:
        assert client.get("/v1/usage?start_date=2026-01-01&end_date=2026-12-31").status_code == 200
        assert client.get("/v1/audit/events?since=2026-01-01T00:00:00Z&until=2026-12-31T00:00:00").status_code == 200
