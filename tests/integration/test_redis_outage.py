"""Redis, the Celery broker, stopped under a running batch and started again (a server of
the test's own, without persistence as `infra/redis.sh` runs it: the restart loses the
queued chunk; the session's shared Redis is never touched). A chunk is held between its
generation and its write while the broker goes; it finishes meanwhile (its report travels
on the log, not the broker), and the dispatcher, unable to queue the next chunk, retries.
What must hold: the Celery worker and the dispatcher ride the outage out, the lost chunk
is sent again (`requeue_after_s`), the batch completes, and every request is in the
Parquet parts and the output file exactly once.
"""
from __future__ import annotations


from models.events_batch import BatchChunkCompleted
from tests.dedicated_services import DedicatedRedis
from tests.helpers import wait_until
from tests.integration.batch_fixtures import s3_settings
from tests.integration.outage_batch import CHUNK, assert_every_row_once, gated_batch_platform, submit
from tests.integration.test_batch_lifecycle import of_batch

LOST = "Connection to broker lost"  # what the Celery worker says when Redis goes
REQUEUE_AFTER_S = 3.0


def test_a_batch_rides_out_a_redis_restart_without_missing_or_doubled_rows(tmp_path, tiny_model_dir, monkeypatch, s3_endpoint):
    gate = tmp_path / "gate"
    gate.mkdir()
    monkeypatch.setenv("LEDGERLM_TEST_BATCH_GATE", str(gate))
    with DedicatedRedis(tmp_path / "redis") as redis, \
            gated_batch_platform(tmp_path / "platform", tiny_model_dir, broker_url=redis.url,
                                 store=s3_settings(), requeue_after_s=REQUEUE_AFTER_S) as plat:
        tenant_id, secret = plat.tenant()
        client, batch, custom_ids = submit(plat, secret, 4 * CHUNK)
        tail = plat.event_tail(tenant_id)
        wait_until(lambda: (gate / "held-1").exists(), 60, what="the first chunk to be generating")

        redis.stop()  # chunk 0 is generating, chunk 1 waits in the broker
        (gate / "open").touch()
        wait_until(lambda: of_batch(tail(), batch.id, BatchChunkCompleted), 30,
                   what="the held chunk to finish while the broker is down")
        plat.worker.wait_for_output(LOST, 30)
        failing = plat.dispatcher.failed_units
        wait_until(lambda: plat.dispatcher.failed_units > failing, 30,
                   what="the dispatcher to meet the outage queueing the next chunk")
        plat.check()  # neither the dispatcher nor the worker has stopped

        redis.start()
        done = plat.wait_terminal(lambda: client.batches.retrieve(batch.id), timeout_s=60)
        plat.check()
        assert_every_row_once(plat, client, done, tenant_id, custom_ids)
