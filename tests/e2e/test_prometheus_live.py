"""Every query an operator is given, and every rule Prometheus runs, finds a real series.

A platform on Kafka, each process its own (`ledgerlm serve api`, `serve admission`,
`serve projector`, and `python -m workers serve worker` on a stand-in engine with a KV
cache), is scraped every second by a real Prometheus (Debian's package, as
`infra/services.sh` installs it) that runs the rules of infra/prometheus/rules.yml and the
recording rules docs/autoscaling.md gives. After a little traffic, each PromQL query in
docs/autoscaling.md's code blocks (its example revision replaced by the one served here)
and each rule's expression is evaluated over Prometheus's HTTP API and must return data.
An alert's expression is asked with its comparisons made `bool`, so it returns the series
it watches whether or not it would fire. No Prometheus installed fails the test."""
from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
import yaml

from models import topics
from models.settings import Settings
from pipelines.admin import commands as admin
from pipelines.bootstrap import Bootstrap
from pipelines.eventlog import TopicSpec
from tests.harness import MODEL_ALIAS, free_port, new_tenant
from tests.helpers import ROOT, Launched, wait_until

DOC = ROOT / "docs" / "autoscaling.md"
RULES = ROOT / "infra" / "prometheus" / "rules.yml"
DOC_REVISION = "tiny@abc"  # the revision docs/autoscaling.md's examples name
PROCESSES = {"admission": ["-m", "api.cli", "serve", "admission"],
             "worker": ["-m", "workers", "serve", "worker"],
             "projector": ["-m", "api.cli", "serve", "projector"]}


# -- what the doc and the rules ask ---------------------------------------------------------

def code_blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, flags=re.S | re.M)


def doc_documents() -> list[dict]:
    docs = []
    for block in code_blocks(DOC.read_text(), "yaml"):
        docs += [d for d in yaml.safe_load_all(block) if isinstance(d, dict)]
    return docs


def walk(node, key: str) -> list:
    """Every value under `key`, at any depth."""
    if isinstance(node, dict):
        return [v for k, v in node.items() if k == key] + [x for v in node.values() for x in walk(v, key)]
    if isinstance(node, list):
        return [x for v in node for x in walk(v, key)]
    return []


def doc_queries(revision: str) -> tuple[list[str], list[str], list[dict]]:
    """(the doc's queries, its adapter templates, its recording rule groups), for `revision`."""
    docs = [yaml.safe_load(json.dumps(d).replace(DOC_REVISION, revision)) for d in doc_documents()]
    queries = [q for d in docs for key in ("query", "expr", "seriesQuery") for q in walk(d, key)]
    for block in code_blocks(DOC.read_text(), "promql"):
        for paragraph in block.replace(DOC_REVISION, revision).split("\n\n"):
            lines = [line for line in paragraph.splitlines() if line.strip() and not line.lstrip().startswith("#")]
            if lines:
                queries.append("\n".join(lines))
    templates = [t for d in docs for t in walk(d, "metricsQuery")]
    groups = [g for d in docs for g in d.get("groups", [])]
    return queries, templates, groups


def watched(expr: str) -> str:
    """An alert's expression with each comparison made `bool`: every series it watches, 0 or 1."""
    return re.sub(r"\s(==|!=|>=|<=|>|<)\s+(?!bool\b)", r" \1 bool ", expr)


def rule_queries() -> list[str]:
    rules = [r for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]]
    return [r["expr"] if "record" in r else watched(r["expr"]) for r in rules]


def test_an_alert_is_asked_for_every_series_it_watches():
    assert watched("a:b > 0.9") == "a:b > bool 0.9"
    assert watched("x > 6\nand y > 6") == "x > bool 6\nand y > bool 6"
    assert watched("m == 0") == "m == bool 0"
    assert watched(watched("m >= 1")) == "m >= bool 1"


# -- the platform and Prometheus --------------------------------------------------------------

def prometheus_binary() -> str:
    path = shutil.which("prometheus")
    if path is None:
        pytest.fail("prometheus is not installed: run `infra/services.sh up prometheus` (Debian's prometheus "
                    "package)", pytrace=False)
    return path


def environment(home: Path, model: Path, kafka_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LEDGERLM_") or k.startswith("LEDGERLM_TEST_")}
    return {**env, "PYTHONUNBUFFERED": "1", "LEDGERLM_HOME": str(home), "LEDGERLM_MODEL": str(model),
            "LEDGERLM_MODEL_ALIAS": MODEL_ALIAS, "LEDGERLM_MAX_MODEL_LEN": "512", "LEDGERLM_ENGINE_MAX_SEQS": "4",
            "LEDGERLM_EVENT_LOG_URL": kafka_url, "LEDGERLM_EVENT_LOG_NAMESPACE": f"prom{uuid.uuid4().hex[:10]}",
            "LEDGERLM_ENGINE_FACTORY": "tests.slow_engine:SlowEngine.from_settings", "LEDGERLM_CPUS": "all",
            "LEDGERLM_TEST_TOKEN_PAUSE_S": "0.05", "LEDGERLM_TEST_KV_TOKENS": "4096",
            "LEDGERLM_AUDIT_SIGNING_KEY": uuid.uuid4().hex, "LEDGERLM_API_PORT": str(free_port()),
            "LEDGERLM_DEFAULT_DEADLINE_MS": "300000", "LEDGERLM_DECISION_TIMEOUT_S": "30"}


def settings_of(env: dict[str, str]) -> Settings:
    return Settings(**{k[len("LEDGERLM_"):].lower(): v for k, v in env.items()
                       if k.startswith("LEDGERLM_") and not k.startswith("LEDGERLM_TEST_")})


def prometheus_config(tmp: Path, targets: dict[str, int], doc_groups: list[dict]) -> Path:
    (tmp / "targets.json").write_text(json.dumps(
        [{"targets": [f"127.0.0.1:{port}"], "labels": {"process": name}} for name, port in targets.items()]))
    (tmp / "doc_rules.yml").write_text(yaml.safe_dump({"groups": doc_groups}))
    config = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms", "evaluation_interval": "1s"},
              "rule_files": [str(RULES), str(tmp / "doc_rules.yml")],
              "scrape_configs": [{"job_name": "ledgerlm",
                                  "file_sd_configs": [{"files": [str(tmp / "targets.json")],
                                                       "refresh_interval": "1s"}]}]}
    path = tmp / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    return path


def query(url: str, expr: str) -> list:
    response = httpx.get(f"{url}/api/v1/query", params={"query": expr}, timeout=10)
    assert response.status_code == 200, f"{expr}\n{response.text}"
    return response.json()["data"]["result"]


def answers(client: httpx.Client, path: str) -> bool:
    try:
        return client.get(path).status_code == 200
    except httpx.TransportError:  # not listening yet
        return False


def drive(base_url: str, secret: str, requests: int) -> None:
    """Requests enough to queue behind four slots, each to its end."""
    body = {"model_alias": MODEL_ALIAS, "input": "how many replicas", "max_output_tokens": 20, "ignore_eos": True,
            "stream": False}
    with httpx.Client(base_url=base_url, timeout=120, headers={"Authorization": f"Bearer {secret}"}) as client:
        wait_until(lambda: answers(client, "/v1/models"), 180, what="the API to serve and know the key", every_s=0.5)
        with ThreadPoolExecutor(requests) as pool:
            replies = list(pool.map(lambda _: client.post("/v1/generations", json=body), range(requests)))
    assert [r.status_code for r in replies] == [200] * requests, [r.text for r in replies if r.status_code != 200]
    assert all(r.json()["type"] == "completed" for r in replies)


def test_every_documented_query_and_rule_returns_data(tiny_model_dir, tmp_path, kafka_url):
    binary = prometheus_binary()
    home = tmp_path / "home"
    home.mkdir()
    env = environment(home, tiny_model_dir, kafka_url)
    approved = subprocess.run([sys.executable, "-m", "workers", "model", "approve"], env=env, capture_output=True,
                              text=True, timeout=600)
    assert approved.returncode == 0, approved.stderr
    revision = json.loads(approved.stdout)["model_revision"]
    settings = settings_of(env)
    with Bootstrap(settings).event_log() as log:  # made here, so the session's cleanup deletes them
        log.ensure_topics([TopicSpec(t.name, t.partitions, t.retention_ms) for t in topics.pool_work_topics(None,
                                                                                                          revision)])
    queries, templates, doc_groups = doc_queries(revision)
    assert len(queries) >= 10 and len(templates) == 1 and doc_groups, "the doc's code blocks were not all read"
    ports = {name: free_port() for name in PROCESSES}
    ports["api"] = int(env["LEDGERLM_API_PORT"])
    started: list[Launched] = []
    try:
        for name, argv in PROCESSES.items():
            ready = {"worker": '"ready": true', "projector": '"ready"'}.get(name)
            started.append(Launched([sys.executable, *argv], env={**env, "LEDGERLM_METRICS_PORT": str(ports[name])},
                                    log=tmp_path / f"{name}.log", ready=ready, ready_s=300, stop_s=30))
        started.append(Launched([sys.executable, "-m", "api.cli", "serve", "api"], env=env,
                                log=tmp_path / "api.log", stop_s=30))
        prom_port = free_port()
        config = prometheus_config(tmp_path, ports, doc_groups)
        started.append(Launched([binary, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                                 f"--web.listen-address=127.0.0.1:{prom_port}"], log=tmp_path / "prometheus.log",
                                ready="Server is ready to receive web requests", ready_s=60, stop_s=30))
        prometheus = f"http://127.0.0.1:{prom_port}"
        wait_until(lambda: len([r for r in query(prometheus, "up == 1")]) == len(ports), 120,
                   what=f"Prometheus to scrape all of {sorted(ports)}")
        with Bootstrap(settings).event_log() as log:
            _, secret = new_tenant(admin.RegistryView(log))
        drive(f"http://127.0.0.1:{ports['api']}", secret, requests=12)

        asked = [*queries, *rule_queries()]
        asked += [t.replace("<<.Series>>", series).replace("<<.LabelMatchers>>", matchers)
                  for t in templates for series, matchers in adapter_series(doc_groups)]
        missing = set(asked)

        def all_answer():
            missing.difference_update({q for q in list(missing) if query(prometheus, q)})
            return not missing
        try:
            wait_until(all_answer, 90, what="every query to return data", every_s=1.0)
        except AssertionError:
            pytest.fail("no data for:\n\n" + "\n\n".join(sorted(missing)), pytrace=False)
        assert_plausible(prometheus, revision)
        for process in started:
            process.check()
    finally:
        for process in reversed(started):
            process.stop()


def assert_plausible(prometheus: str, revision: str) -> None:
    """The signals say what the platform did: one worker serves the alias, requests of a known
    size arrived, one replica's goodput is measured, and the count keeps at least the spare."""
    def value(expr: str) -> float:
        [sample] = query(prometheus, expr)
        return float(sample["value"][1])
    mine = f'pool="{topics.SHARED_POOL}", revision="{revision}"'
    assert value(f'alias_revision:ledgerlm_alias_serving_workers:max{{alias="{MODEL_ALIAS}"}}') == 1
    assert value(f"sum(ledgerlm_admission_demand_output_tokens_per_second{{{mine}}})") > 0
    assert value(f"max(ledgerlm_replica_goodput_output_tokens_per_second{{{mine}}})") > 0
    assert value(f"pool_revision:ledgerlm_desired_replicas:plan{{{mine}}}") >= 2
    assert 0 <= value(f"pool_revision:ledgerlm_admission_kv_pressure:sum{{{mine}}}") <= 1
    assert value(f"ledgerlm_fleet_serving_workers{{{mine}}}") == 1


def adapter_series(doc_groups: list[dict]) -> list[tuple[str, str]]:
    """(series, label matchers) for each series the doc's recording rules make, with the
    deployment label the doc's HPA selects on, as prometheus-adapter fills its template."""
    selectors = [s for d in doc_documents() for s in walk(d, "matchLabels")]
    assert selectors, "the doc's HPA selects no series"
    matchers = ",".join(f'{k}="{v}"' for k, v in selectors[0].items())
    return [(rule["record"], matchers) for group in doc_groups for rule in group["rules"]]
