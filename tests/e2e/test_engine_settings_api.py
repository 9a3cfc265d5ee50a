"""`POST /v1/admin/models` with engine settings: they are recorded on the revision and
shown by `GET /v1/admin/models`; two approvals of one model differing in dtype are two
revisions with two hashes; a setting the engine would refuse is a 400 naming it, and
nothing is approved."""
from __future__ import annotations

import uuid

from models.engine_settings import detect_device, resolve
from workers.engine_config import VllmEngineConfig, engine_config_hash


def _approval(name: str, revision: str, model_dir, **settings) -> dict:
    return {"alias": name, "model_revision": revision, "model_path": str(model_dir), "max_model_len": 512,
            "engine_config_hash": engine_config_hash(VllmEngineConfig(model=model_dir, **{
                k: v for k, v in settings.items() if k in ("dtype", "enforce_eager")})), **settings}


def test_an_approval_records_its_engine_settings_and_the_listing_shows_them(api, tiny_model_dir):
    _, operator = api.tenant(scopes=("operator",))
    name = "m-" + uuid.uuid4().hex[:8]
    if detect_device().kind != "cpu":
        raise AssertionError("the refusals below are the CPU's: run this on a CPU host")
    with api.client(operator) as client:
        fp32 = client.post("/v1/admin/models", json=_approval(name, f"{name}@fp32", tiny_model_dir))
        bf16 = client.post("/v1/admin/models", json=_approval(
            f"{name}-bf16", f"{name}@bf16", tiny_model_dir, dtype="bfloat16", max_num_batched_tokens=512,
            kv_cache_gb=2))
        assert (fp32.status_code, bf16.status_code) == (201, 201), (fp32.text, bf16.text)
        assert bf16.json()["engine_settings"]["dtype"] == "bfloat16"

        refusals = {}
        for field, value in (("tensor_parallel_size", 2), ("gpu_memory_utilization", 0.9), ("dtype", "fp7"),
                             ("quantization", "zip"), ("max_num_batched_tokens", 0), ("tensor_parallel_size", "x")):
            refused = client.post("/v1/admin/models", json=_approval(
                name, f"{name}@bad-{field}", tiny_model_dir, **{field: value}))
            assert refused.status_code == 400, refused.text
            error = refused.json()["error"]
            assert (error["param"], error["code"]) == (field, "invalid_value"), error
            assert field in error["message"] and "\n" not in error["message"]
            refusals[field, value] = error["message"]
        listed = {r["model_revision"]: r for r in client.get("/v1/admin/models").json()["data"]}

    assert "applies only on a GPU" in refusals["gpu_memory_utilization", 0.9]
    assert "must be 1 on CPU" in refusals["tensor_parallel_size", 2]
    assert not [r for r in listed if "@bad-" in r]  # a refused approval leaves nothing behind
    first, second = listed[f"{name}@fp32"], listed[f"{name}@bf16"]
    assert first["engine_settings"] == resolve({}, detect_device()).model_dump()
    assert second["engine_settings"] == {
        "dtype": "bfloat16", "quantization": None, "tensor_parallel_size": 1, "enforce_eager": True,
        "kv_cache_gb": 2.0, "gpu_memory_utilization": None, "max_num_batched_tokens": 512}
    assert first["engine_config_hash"] != second["engine_config_hash"]  # two revisions a rollout can compare
