"""Fair share reads ahead and takes work out of order; a worker that dies then must leave
every untaken item to its successor and no taken one. A fake engine holds the first
worker's generations open, so the crash finds work taken past its commit point. Runs on
both event logs."""
from __future__ import annotations

import uuid

import pytest

from pipelines.eventlog import partition_for
from tests.conftest import make_log_opener
from tests.fake_engine import FakeEngine, queue_work, run_until, started_ids
from workers.engine_runner import EngineRunner
from workers.interactive import InteractiveWorker


@pytest.mark.parametrize("kind", ["embedded", "kafka"])
def test_work_taken_out_of_order_is_neither_lost_nor_run_twice_after_a_crash(kind, tmp_path):
    open_log = make_log_opener(kind, tmp_path)
    log = open_log()
    heavy, light = "t0", "t2"  # two tenants whose work shares one partition
    assert partition_for(heavy, 4) == partition_for(light, 4)
    run = uuid.uuid4().hex[:6]
    order = [f"{heavy}-{run}-{i}" for i in range(4)] + [f"{light}-{run}-0"]
    for request_id in order:
        queue_work(log, request_id.split("-")[0], request_id)

    holding = EngineRunner(FakeEngine(hold=True)).start()
    first_log = open_log()
    first = InteractiveWorker(first_log, holding, holding.engine, max_in_flight=2, worker_id=f"first-{run}")
    try:
        # Fair share takes the heavy tenant's first item and then the light tenant's, which is
        # last in the partition: the commit point stays at the heavy tenant's second item.
        run_until(first, lambda: len(holding.engine.started) == 2, "the first worker to start two")
        assert sorted(holding.engine.started) == sorted([order[0], order[4]])
    finally:
        first._consumer.close()  # dies: no terminal events, no further commits
        first._cancels.stop()
        holding.close()
        first_log.close()

    finishing = EngineRunner(FakeEngine(hold=False)).start()
    second_log = open_log()
    second = InteractiveWorker(second_log, finishing, finishing.engine, max_in_flight=8, worker_id=f"second-{run}")
    try:
        run_until(second, lambda: len(finishing.engine.started) >= 3 and second.in_flight == 0,
                  "the second worker to take the rest")
        for _ in range(20):  # a few more rounds: anything redelivered would start now
            second.run_once(0.05)
        assert sorted(finishing.engine.started) == sorted(order[1:4])
        assert sorted(started_ids(log)) == sorted(order)
    finally:
        second.close()
        finishing.close()
        second_log.close()
        log.close()
