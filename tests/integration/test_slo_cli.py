"""`ledgerlm slo report` run as a user runs it, over a projected ledger: the JSON is the
report of the window asked for, the table shows each class, availability and rejection,
and a bad window or bad class thresholds stop it with a message that names them."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import timedelta

import pytest

from tests.helpers import ROOT
from tests.integration.conftest_ledger import project
from tests.integration.test_slo_report import T0, WINDOW, build
from tests.ledger_workload import append_all

UNTIL = (T0 + WINDOW).isoformat()


@pytest.fixture
def projected(embedded_ledger_log, tmp_path):
    log = embedded_ledger_log()
    ledger = build()
    append_all(log, ledger.events)
    url = f"sqlite:///{tmp_path / 'slo.db'}"
    from migrations.runner import upgrade

    upgrade(url)
    project(log, url)
    log.close()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "LEDGERLM_HOME": str(tmp_path), "LEDGERLM_DATABASE_URL": url,
           "LEDGERLM_PROMPT_SHORT_MAX_TOKENS": "128", "LEDGERLM_PROMPT_LONG_MIN_TOKENS": "1024"}
    return env, ledger


def ledgerlm(env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "api.cli", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)


def test_the_json_report_is_the_windows_and_the_table_shows_each_part(projected):
    env, ledger = projected
    answer = ledgerlm(env, "slo", "report", "--window", "10m", "--until", UNTIL, "--json")
    assert answer.returncode == 0, answer.stderr
    report = json.loads(answer.stdout)
    assert report["prompt_classes"] == {"short_max_tokens": 128, "long_min_tokens": 1024}
    assert report["since"] == T0.isoformat()
    latency = {(x["model_revision"], x["prompt_class"]): x for x in report["latency"]}
    assert {k: v["generations"] for k, v in latency.items()} == {k: len(v) for k, v in ledger.ttft.items()}
    assert {r: c["all"] for r, c in report["rejections_by_reason"].items()} == dict(ledger.rejections)
    total = report["total"]
    assert total["availability"] == total["completed"] / total["judged"]

    text = ledgerlm(env, "slo", "report", "--window", "10m", "--until", UNTIL)
    assert text.returncode == 0, text.stderr
    for line in ("LATENCY", "AVAILABILITY", "REJECTIONS BY REASON", "short up to 128 input tokens, long from 1024"):
        assert line in text.stdout
    for (revision, cls), row in latency.items():
        assert any(s.split()[:3] == [revision, cls, str(row["generations"])] for s in text.stdout.splitlines())
    shown = {s.split()[0]: s.split()[-1] for s in text.stdout.split("REJECTIONS BY REASON")[1].splitlines()[2:]}
    assert {r: int(n) for r, n in shown.items()} == dict(ledger.rejections)


def test_a_window_before_the_traffic_has_only_what_was_in_it_and_a_revision_filter_keeps_to_its_revision(projected):
    env, _ = projected
    before = ledgerlm(env, "slo", "report", "--window", "1h", "--until", T0.isoformat(), "--json")
    assert before.returncode == 0, before.stderr
    hour = json.loads(before.stdout)  # only the failure a millisecond before the window the others are in
    assert hour["latency"] == [] and hour["rejections"] == []
    assert (hour["total"]["admitted"], hour["total"]["failed"], hour["total"]["availability"]) == (1, 1, 0.0)
    earlier = json.loads(ledgerlm(env, "slo", "report", "--window", "1h", "--until",
                                  (T0 - timedelta(hours=1)).isoformat(), "--json").stdout)
    assert earlier["total"]["admitted"] == 0 and earlier["total"]["availability"] is None

    one = json.loads(ledgerlm(env, "slo", "report", "--window", "10m", "--until", UNTIL, "--revision", "tiny@r2",
                              "--json").stdout)
    assert {x["model_revision"] for x in one["latency"] + one["availability"] + one["rejections"]} == {"tiny@r2"}


def test_a_bad_window_is_refused_with_how_to_write_one(projected):
    env, _ = projected
    answer = ledgerlm(env, "slo", "report", "--window", "an hour")
    assert answer.returncode == 2 and "not a window: 'an hour'" in answer.stderr


def test_bad_class_thresholds_stop_it_at_start_naming_the_setting(projected):
    env, _ = projected
    answer = ledgerlm({**env, "LEDGERLM_PROMPT_LONG_MIN_TOKENS": "100"}, "slo", "report")
    assert answer.returncode != 0 and answer.stdout == ""
    assert "prompt_long_min_tokens" in answer.stderr and "prompt_short_max_tokens" in answer.stderr


def test_the_window_is_read_back_as_a_span(projected):
    env, _ = projected
    answer = json.loads(ledgerlm(env, "slo", "report", "--window", "90s", "--until", UNTIL, "--json").stdout)
    assert answer["since"] == (T0 + WINDOW - timedelta(seconds=90)).isoformat()
