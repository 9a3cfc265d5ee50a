"""`/metrics` and the API's docs, turned off or put behind a key by the settings: an API
replica over the shared platform, served with those settings, answers as they say."""
from __future__ import annotations

import contextlib

import httpx


@contextlib.contextmanager
def replica(platform, **settings):
    with platform.api_replica(**settings) as url, httpx.Client(base_url=url, timeout=30) as client:
        yield client


def bearer(secret: str) -> dict:
    return {"Authorization": f"Bearer {secret}"}


def test_metrics_and_docs_are_open_by_default(platform):
    with platform.client() as anyone:
        assert anyone.get("/metrics").status_code == 200
        assert anyone.get("/openapi.json").status_code == 200 and anyone.get("/docs").status_code == 200


def test_metrics_behind_a_key_and_docs_off(platform):
    _, operator = platform.tenant(scopes=("operator",))
    _, plain = platform.tenant()
    with replica(platform, metrics_access="key", docs_access="off", ops_token="scrape-me") as client:
        assert client.get("/metrics").status_code == 401
        assert client.get("/metrics", headers=bearer(plain)).status_code == 403
        assert client.get("/metrics", headers=bearer("not-the-token")).status_code == 401
        for allowed in ("scrape-me", operator):
            scraped = client.get("/metrics", headers=bearer(allowed))
            assert scraped.status_code == 200 and "ledgerlm_" in scraped.text
        for path in ("/openapi.json", "/docs", "/redoc"):
            off = client.get(path, headers=bearer(operator))
            assert off.status_code == 404 and "error" in off.json(), path  # as if it never existed
        assert client.get("/v1/models", headers=bearer(plain)).status_code == 200, "the API itself is unchanged"


def test_docs_behind_a_key_and_metrics_off(platform):
    _, operator = platform.tenant(scopes=("operator",))
    _, plain = platform.tenant()
    with replica(platform, metrics_access="off", docs_access="key", ops_token="scrape-me") as client:
        assert client.get("/metrics", headers=bearer("scrape-me")).status_code == 404
        for path in ("/openapi.json", "/docs", "/redoc"):
            assert client.get(path).status_code == 401, path
            assert client.get(path, headers=bearer(plain)).status_code == 403, path
            assert client.get(path, headers=bearer(operator)).status_code == 200, path
        schema = client.get("/openapi.json", headers=bearer("scrape-me")).json()
        assert "/v1/generations" in schema["paths"] and "/openapi.json" not in schema["paths"]
