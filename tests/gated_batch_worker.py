"""The Celery batch worker (`workers.batch`) with a stand-in engine, for tests about the
queue and the object store, where the text does not matter and vLLM's start-up would
cost most of the test:

    celery -A tests.gated_batch_worker worker ...

With `LEDGERLM_TEST_BATCH_GATE` naming a folder, each chunk's generation writes
`held-<n>` there and waits for a file `open` in it, so a test can take a backing
service away while a chunk is between its generation and its Parquet write.
"""
from __future__ import annotations

import os
from functools import partial
from pathlib import Path

import workers.batch_metrics  # noqa: F401 - the child serves /metrics when LEDGERLM_METRICS_PORT is set
from workers import batch
from workers.batch_engine import EngineSlot, GenResult
from tests.helpers import wait_until

GATE_WAIT_S = 120.0  # a test that never opens the gate has failed long before this


class StandInBatchEngine:
    """Echoes each prompt's first tokens back as its completion."""

    calls = 0

    def __init__(self, _config=None):
        pass

    def generate(self, requests, *, tenant_id):
        gate = os.environ.get("LEDGERLM_TEST_BATCH_GATE")
        if gate:
            StandInBatchEngine.calls += 1
            (Path(gate) / f"held-{StandInBatchEngine.calls}").touch()
            wait_until((Path(gate) / "open").exists, GATE_WAIT_S, what=f"the test to open the batch gate {gate}")
        return [GenResult(f"echo of {tenant_id}", list(r.prompt_token_ids[:r.max_tokens]), "length",
                          len(r.prompt_token_ids)) for r in requests]

    def close(self):
        pass


batch.EngineSlot = partial(EngineSlot, factory=StandInBatchEngine)  # what `workers.batch.resources` makes
celery_app = batch.celery_app
