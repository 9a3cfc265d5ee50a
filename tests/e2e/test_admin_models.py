"""`GET /v1/admin/models`: an operator reads the approved revisions, with the aliases pointing
at them, their model, engine config hash, context length, prices and retirement; nobody
else reads them."""
from __future__ import annotations

import uuid

from models.engine_settings import detect_device, resolve


def test_an_operator_lists_the_approved_revisions_and_no_one_else_does(api):
    _, operator = api.tenant(scopes=("operator",))
    _, plain = api.tenant()
    _, tenant_admin = api.tenant(scopes=("tenant_admin",))
    name = "m-" + uuid.uuid4().hex[:8]
    with api.client(operator) as client:
        approved = client.post("/v1/admin/models", json={
            "alias": name, "model_revision": f"{name}@v2", "model_path": "/models/v2", "engine_config_hash": "abc",
            "max_model_len": 1024, "price_input_per_1k_micros": 150, "price_output_per_1k_micros": 600})
        assert approved.status_code == 201, approved.text
        listed = client.get("/v1/admin/models")
        assert listed.status_code == 200, listed.text
        body = listed.json()
        retired = client.post(f"/v1/admin/models/{name}@v2/retire", json={"reason": "superseded"})
        assert retired.status_code == 200, retired.text
        after = {r["model_revision"]: r for r in client.get("/v1/admin/models").json()["data"]}
    assert body["object"] == "list"
    revisions = {r["model_revision"]: r for r in body["data"]}
    assert set(revisions) >= {api.model_revision, f"{name}@v2"}
    assert revisions[f"{name}@v2"] == {
        "model_revision": f"{name}@v2", "aliases": [{"alias": name, "allowed_tenants": ["*"]}],
        "model_path": "/models/v2", "engine_config_hash": "abc", "max_model_len": 1024,
        "price_input_per_1k_micros": 150, "price_output_per_1k_micros": 600, "retired": False,
        "engine_settings": resolve({}, detect_device()).model_dump(),  # the API host's defaults
        "retired_reason": None, "artifacts": None}
    assert {"alias": "tiny", "allowed_tenants": ["*"]} in revisions[api.model_revision]["aliases"]
    assert (after[f"{name}@v2"]["retired"], after[f"{name}@v2"]["retired_reason"]) == (True, "superseded")

    for secret, status in ((plain, 403), (tenant_admin, 403), (None, 401)):
        with api.client(secret) as client:
            assert client.get("/v1/admin/models").status_code == status, secret
