"""A summarization job end to end on a real model: SmolLM2-135M-Instruct approved as a
revision beside the tiny one, a few short news items in, Parquet summaries on S3 out that
name what each item named (which a random model cannot write). Slow on a CPU, so the
documents are few and short and the summaries brief."""
from __future__ import annotations

import io
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from models import batch_keys as keys
from pipelines.admin import commands as admin
from workers.vllm_engine import VllmEngineConfig, engine_config_hash

pytest_plugins = ["tests.integration.batch_fixtures", "tests.small_model_fixture"]

ALIAS = "smollm2"
MAX_MODEL_LEN = 512
# The model's own chat format, written into the template: a summarization job sends text.
TEMPLATE = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
            "<|im_start|>user\nSummarize this news in one sentence.\n\n{text}<|im_end|>\n<|im_start|>assistant\n")
# Each item, and the names of which its summary must hold at least one.
NEWS = {
    "library": ("Maria Lopez, the mayor of Portland, opened a new public library on Monday. "
                "The three-story building holds 200,000 books and a rooftop garden.", ("Portland", "Lopez")),
    "bridge": ("Engineers in Lisbon closed the old river bridge for repairs on Tuesday. "
               "Traffic will use a ferry service until the work ends in March.", ("Lisbon",)),
    "festival": ("The city of Edinburgh welcomed a million visitors to its summer arts festival. "
                 "Hotels reported record bookings for the whole of August.", ("Edinburgh",)),
}


def fetch(http, job_id: str) -> SimpleNamespace:
    body = http.get(f"/v1/summarizations/{job_id}").json()
    return SimpleNamespace(status=body["status"], body=body)


@pytest.fixture(scope="module")
def smollm2_alias(batch_platform, small_model_dir) -> str:
    """SmolLM2 approved as a revision of its own on this platform; returns the revision."""
    config_hash = engine_config_hash(VllmEngineConfig(model=small_model_dir, max_model_len=MAX_MODEL_LEN))
    revision = f"{small_model_dir.name}@{config_hash}"
    admin.approve_model(batch_platform.view, alias=ALIAS, model_revision=revision, model_path=str(small_model_dir),
                        engine_config_hash=config_hash, max_model_len=MAX_MODEL_LEN, actor="tests")
    return revision


# One log is enough here (the model is slow on CPU); both logs run the tiny model's jobs.
@pytest.mark.parametrize("batch_platform", ["kafka"], indirect=True)
def test_summaries_from_the_small_model_name_what_the_news_named(batch_platform, smollm2_alias):
    tenant, secret = batch_platform.tenant()
    store = batch_platform.store
    buffer = io.BytesIO()
    pq.write_table(pa.Table.from_pylist([{"id": doc_id, "text": text} for doc_id, (text, _) in NEWS.items()]),
                   buffer)
    input_key = keys.tenant_prefix(tenant) + "inputs/news.parquet"
    store.put_bytes(input_key, buffer.getvalue())
    with batch_platform.http(secret) as http:
        created = http.post("/v1/summarizations", json={
            "model": ALIAS, "input_url": store.uri(input_key), "max_output_tokens": 32, "prompt_template": TEMPLATE})
        assert created.status_code == 200, created.text
        job_id = created.json()["id"]
        job = batch_platform.wait_terminal(lambda: fetch(http, job_id), timeout_s=300).body
    assert job["status"] == "completed", job
    assert job["request_counts"] == {"total": len(NEWS), "completed": len(NEWS), "failed": 0}
    assert job["model_revision"] == smollm2_alias

    rows = pq.read_table(job["data_uri"].removeprefix("s3://"), filesystem=store.fs).to_pylist()
    print("\n" + "\n".join(f"{r['id']}: {r['summary']!r} ({r['output_tokens']} tokens)" for r in rows))
    assert {r["id"] for r in rows} == set(NEWS) and {r["model_revision"] for r in rows} == {smollm2_alias}
    for row in rows:
        names = NEWS[row["id"]][1]
        assert row["error"] is None and any(name in row["summary"] for name in names), row
