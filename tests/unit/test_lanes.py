"""Each test lands in exactly one lane, and its service markers come from its fixtures and
parameters (`tests.lanes`)."""
from __future__ import annotations

import tomllib

import pytest

from tests import lanes
from tests.helpers import ROOT


@pytest.mark.parametrize("fixtures, params, expected", [
    (["tmp_path"], {}, set()),
    (["platforms", "engine_runner", "platform"], {"platform": "embedded"}, {"vllm"}),
    (["platforms", "engine_runner", "platform"], {"platform": "kafka"}, {"vllm", "kafka"}),
    (["platforms", "engine_runner", "platform"], {"platform": "kafka-admit"}, {"vllm", "kafka"}),
    (["open_log"], {"open_log": "kafka-namespaced"}, {"kafka"}),
    (["ledger_dbs"], {"ledger_dbs": "sqlite"}, set()),
    (["ledger_dbs"], {"ledger_dbs": "postgres"}, {"postgres"}),
    (["batch_platform"], {"batch_platform": "embedded"}, {"redis", "s3", "vllm"}),
    (["console_platform", "driver"], {}, {"postgres", "browser"}),
    (["kafka_url"], {"log_kind": "embedded"}, {"kafka"}),
    (["prometheus_url"], {}, {"prometheus"}),
    (["own_vllm"], {}, {"vllm"}),
    (["text"], {"text": "kafkaesque"}, set()),  # a parameter only names a service exactly
    (["n"], {"n": 3}, set()),
])
def test_service_marks_come_from_fixtures_and_parameters(fixtures, params, expected):
    assert lanes.service_marks(fixtures, params) == expected


@pytest.mark.parametrize("path, fixtures, lane", [
    ("tests/unit/test_quota.py", [], "unit"),
    ("tests/unit/test_projection_merge.py", ["tmp_path"], "unit"),  # the folder wins over the name
    ("tests/contract/test_eventlog.py", ["kafka_test_servers"], "contract"),
    ("tests/integration/test_usage_daily.py", ["ledger_dbs"], "ledger"),
    ("tests/integration/test_projections_crash.py", ["ledger_log"], "ledger"),  # ledger before faults
    ("tests/integration/test_tenant_limits_projection.py", [], "ledger"),
    ("tests/integration/test_migrations.py", ["postgres_url"], "ledger"),
    ("tests/integration/test_small_model_summarization.py", ["batch_platform"], "batch"),
    ("tests/e2e/test_batch_cli.py", ["own_vllm"], "batch"),
    ("tests/integration/test_redis_outage.py", ["s3_endpoint"], "faults-and-processes"),
    ("tests/e2e/test_worker_sigkill.py", ["kafka_url"], "faults-and-processes"),
    ("tests/e2e/test_admin_cli.py", [], "faults-and-processes"),
    ("tests/e2e/test_streaming.py", ["platform"], "platform"),
    ("tests/integration/test_vllm_engine.py", ["engine_runner"], "platform"),
])
def test_each_test_lands_in_one_lane_by_folder_then_fixtures_then_name(path, fixtures, lane):
    assert lanes.lane_of(path, fixtures) == lane


def test_a_lane_that_does_not_start_a_service_its_test_needs_is_found():
    assert lanes.unstarted("platform", {"vllm", "kafka", "redis"}) == {"redis"}
    assert lanes.unstarted("faults-and-processes", {"kafka", "redis", "s3", "postgres", "prometheus"}) == set()
    assert lanes.unstarted("unit", {"vllm"}) == set()  # an engine is not a service to start


def test_every_lane_service_and_need_is_a_declared_marker():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    declared = {line.split(":", 1)[0] for line in config["tool"]["pytest"]["ini_options"]["markers"]}
    assert {*lanes.LANES, *lanes.SERVICES, *lanes.NEEDS} <= declared
    marked = set().union(*lanes.FIXTURE_MARKS.values())
    assert marked <= {*lanes.SERVICES, *lanes.NEEDS}


def test_the_makefile_asks_which_services_a_lane_starts(capsys):
    assert lanes.main(["services", "ledger"]) == 0
    assert capsys.readouterr().out.split() == ["kafka", "postgres"]
    assert lanes.main(["services", "unit"]) == 0
    assert capsys.readouterr().out.strip() == ""
    assert lanes.main(["lanes"]) == 0
    assert capsys.readouterr().out.split() == list(lanes.LANES)
    assert lanes.main(["services", "nightly"]) == 2
    assert "usage" in capsys.readouterr().err


def test_a_test_that_reaches_a_service_its_markers_do_not_name_fails():
    from tests.conftest import service_url

    with pytest.raises(pytest.fail.Exception, match="is not marked postgres"):
        service_url("postgres")
