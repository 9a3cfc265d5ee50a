"""The two ways the platform is deployed run the processes `ledgerlm serve` declares
(api/cli/processes.py) with the environment those processes read: the Helm chart
(infra/helm/ledgerlm, rendered with `helm template`) and infra/compose.yaml, read as YAML.
The chart runs one Deployment per process and one per worker revision, on the external
Kafka, PostgreSQL, Redis and S3 its values name, GPU workers included, each probed on the
health endpoint it serves. Helm is built by `make install` (infra/install_helm.sh); a
missing binary fails these tests."""
from __future__ import annotations

import os
import re
import subprocess
from collections import Counter
from pathlib import Path

import pytest
import yaml

from api.cli.processes import PROCESSES, arguments
from models.settings import Settings
from tests.helpers import ROOT

LOCAL = Path(os.environ.get("LEDGERLM_LOCAL", ROOT / ".local"))
HELM = LOCAL / "bin" / "helm"
CHART = ROOT / "infra" / "helm" / "ledgerlm"
COMPOSE = ROOT / "infra" / "compose.yaml"
GPU = "nvidia.com/gpu"

# What a release must give: the brokers and the credentials (the chart refuses to render without them).
REQUIRED = {
    "kafka": {"url": "kafka://kafka-0.kafka:9092,kafka-1.kafka:9092"},
    "secrets": {"databaseUrl": "postgresql+psycopg://ledgerlm:pw@pg.db:5432/ledgerlm",
                "celeryBrokerUrl": "redis://:pw@redis.cache:6379/0", "s3Key": "key", "s3Secret": "secret",
                "auditSigningKey": "a-long-random-secret-of-our-own"},
}
# Everything compose passes on as well: an S3-compatible endpoint, a model and the bootstrap token.
FULL = {**REQUIRED, "s3": {"url": "s3://ledgerlm", "endpointUrl": "http://minio.store:9000"},
        "model": "/models/Qwen2.5-0.5B-Instruct",
        "secrets": {**REQUIRED["secrets"], "bootstrapToken": "bootstrap"}}
REVISIONS = {**REQUIRED, "workers": {"revisions": [
    {"name": "qwen", "revision": "qwen-rev-1"},
    {"name": "llama", "alias": "chat", "pool": "gold", "admit": True, "gpus": 2, "replicas": 3,
     "env": {"LEDGERLM_MODEL": "/models/llama"}},
]}}


@pytest.fixture(autouse=True)
def _no_settings_from_this_shell(monkeypatch):
    """Settings built from a rendered environment take nothing from the test run's own."""
    for name in [name for name in os.environ if name.startswith("LEDGERLM_") and name != "LEDGERLM_LOCAL"]:
        monkeypatch.delenv(name)


def helm(*args: str, tmp_path: Path, values: dict | None = None) -> subprocess.CompletedProcess:
    if not HELM.exists():
        pytest.fail(f"no helm at {HELM}: `make install` builds it (bash infra/install_helm.sh)", pytrace=False)
    extra = []
    tmp_path.mkdir(parents=True, exist_ok=True)
    if values is not None:
        (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
        extra = ["-f", str(tmp_path / "values.yaml")]
    env = {**os.environ, "HELM_CACHE_HOME": str(tmp_path / "cache"), "HELM_CONFIG_HOME": str(tmp_path / "config"),
           "HELM_DATA_HOME": str(tmp_path / "data")}
    return subprocess.run([str(HELM), *args, str(CHART), *extra], capture_output=True, text=True, timeout=120,
                          env=env)


def render(tmp_path: Path, values: dict) -> list[dict]:
    done = helm("template", "ledgerlm", tmp_path=tmp_path, values=values)
    assert done.returncode == 0, done.stderr
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def deployments(docs: list[dict]) -> list[dict]:
    return [doc for doc in docs if doc["kind"] == "Deployment"]


def main_container(deployment: dict) -> dict:
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


def served(container: dict) -> tuple[str, list[str]]:
    """The process a container runs with `ledgerlm serve`, and its flags."""
    argv = container["command"] + container["args"]
    assert argv[:2] == ["ledgerlm", "serve"], argv
    return argv[2], argv[3:]


def environment(container: dict, docs: list[dict]) -> dict[str, str | None]:
    """A container's environment, with what it takes from the rendered Secret filled in."""
    secrets = {doc["metadata"]["name"]: doc.get("stringData", {}) for doc in docs if doc["kind"] == "Secret"}
    env = {}
    for var in container["env"]:
        if "valueFrom" in var:
            ref = var["valueFrom"]["secretKeyRef"]
            env[var["name"]] = secrets[ref["name"]].get(ref["key"])
            assert env[var["name"]] is not None or ref.get("optional"), f"{var['name']}: no {ref['key']} in the Secret"
        else:
            env[var["name"]] = var["value"]
    return env


def compose_services() -> dict[str, dict]:
    """Each compose service that runs `ledgerlm serve NAME`, by NAME."""
    services = yaml.safe_load(COMPOSE.read_text())["services"]
    return {s["command"][2]: s for s in services.values() if s.get("command", [])[:2] == ["ledgerlm", "serve"]}


def compose_env(service: dict) -> tuple[set[str], set[str]]:
    """The names a compose service sets, and those it passes on from the host only when set there."""
    entries = service["environment"]
    return {e.split("=", 1)[0] for e in entries if "=" in e}, {e for e in entries if "=" not in e}


def known_settings() -> set[str]:
    """The LEDGERLM_* names the platform reads: its settings, and the few read outside them."""
    names = {f"LEDGERLM_{field.upper()}" for field in Settings.model_fields}
    for folder in ("api", "models", "pipelines", "workers"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"[\"'](LEDGERLM_[A-Z0-9_]+)[\"']", path.read_text()))
    return names


def test_helm_lint_passes_and_the_chart_refuses_to_render_without_credentials(tmp_path):
    linted = helm("lint", "--strict", tmp_path=tmp_path, values=REQUIRED)
    assert linted.returncode == 0, linted.stdout + linted.stderr
    refused = helm("template", "ledgerlm", tmp_path=tmp_path)
    assert refused.returncode != 0 and "secrets.databaseUrl is required" in refused.stderr
    both = {**REQUIRED, "workers": {"revisions": [{"name": "a", "revision": "r", "alias": "x"}]}}
    refused = helm("template", "ledgerlm", tmp_path=tmp_path, values=both)
    assert refused.returncode != 0 and "give revision or alias, not both" in refused.stderr


def test_the_chart_runs_each_declared_process_once_by_default_with_flags_it_takes(tmp_path):
    containers = [main_container(d) for d in deployments(render(tmp_path, REQUIRED))]
    found = [served(c)[0] for c in containers]
    assert Counter(found) == Counter(list(PROCESSES)), f"the chart serves {found}; declared: {list(PROCESSES)}"
    for container in containers:
        name, flags = served(container)
        assert arguments(name, *flags).process == name


def test_one_worker_deployment_per_revision_each_on_its_own_gpus(tmp_path):
    docs = render(tmp_path, REVISIONS)
    workers = {d["metadata"]["name"]: d for d in deployments(docs) if served(main_container(d))[0] == "worker"}
    assert set(workers) == {"ledgerlm-worker-qwen", "ledgerlm-worker-llama"}
    qwen, llama = workers["ledgerlm-worker-qwen"], workers["ledgerlm-worker-llama"]
    assert served(main_container(qwen))[1] == ["--revision", "qwen-rev-1"]
    args = arguments("worker", *served(main_container(llama))[1])
    assert (args.alias, args.pool, args.admit, args.revision) == ("chat", "gold", True, None)
    assert (qwen["spec"]["replicas"], llama["spec"]["replicas"]) == (1, 3)
    assert main_container(qwen)["resources"]["limits"][GPU] == 1, "one GPU per interactive worker by default"
    assert main_container(llama)["resources"]["limits"][GPU] == 2
    assert environment(main_container(llama), docs)["LEDGERLM_MODEL"] == "/models/llama"
    assert qwen["spec"]["selector"] != llama["spec"]["selector"], "each Deployment owns only its own pods"
    on_gpus = {served(main_container(d))[0] for d in deployments(docs)
               if GPU in main_container(d).get("resources", {}).get("limits", {})}
    assert on_gpus == {"worker", "batch-worker"}
    twice = {**REQUIRED, "workers": {"revisions": [{"name": "a"}, {"name": "a"}]}}
    refused = helm("template", "ledgerlm", tmp_path=tmp_path, values=twice)
    assert refused.returncode != 0 and '"a" is listed twice' in refused.stderr


@pytest.mark.parametrize("values", [REQUIRED, FULL], ids=["required", "full"])
def test_every_process_runs_on_the_external_services_the_values_name(tmp_path, values):
    docs = render(tmp_path, values)
    known = known_settings()
    for deployment in deployments(docs):
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["initContainers"] + pod["containers"]:
            env = environment(container, docs)
            assert set(env) <= known, f"{container['name']}: not a setting: {set(env) - known}"
            settings = Settings(**{name.removeprefix("LEDGERLM_").lower(): value
                                   for name, value in env.items() if value is not None})
            # Nothing embedded: every store is the external one the values name.
            assert settings.event_log_url == values["kafka"]["url"]
            assert settings.database_url == values["secrets"]["databaseUrl"]
            assert settings.celery_broker_url == values["secrets"]["celeryBrokerUrl"]
            assert settings.object_store_url == "s3://ledgerlm"
            assert settings.s3_endpoint_url == values.get("s3", {}).get("endpointUrl")
            assert (settings.s3_key, settings.s3_secret) == ("key", "secret")
            assert settings.audit_signing_key == values["secrets"]["auditSigningKey"]
            assert settings.model == (Path(values["model"]) if "model" in values else None)
        (migrate,) = pod["initContainers"]
        assert migrate["command"] + migrate["args"] == yaml.safe_load(COMPOSE.read_text())["services"]["migrate"][
            "command"], "the schema is upgraded before each process starts, as compose's migrate does"


def test_kafka_security_values_become_the_settings_of_the_same_names(tmp_path):
    values = {**REQUIRED, "kafka": {**REQUIRED["kafka"], "securityProtocol": "SASL_SSL",
                                    "saslMechanism": "SCRAM-SHA-512", "saslUsername": "ledgerlm",
                                    "namespace": "prod", "replicationFactor": 3},
              "secrets": {**REQUIRED["secrets"], "kafkaSaslPassword": "sasl-pw"}}
    docs = render(tmp_path, values)
    env = environment(main_container(deployments(docs)[0]), docs)
    settings = Settings(**{name.removeprefix("LEDGERLM_").lower(): value for name, value in env.items()})
    assert (settings.kafka_security_protocol, settings.kafka_sasl_mechanism, settings.kafka_sasl_username) == (
        "SASL_SSL", "SCRAM-SHA-512", "ledgerlm")
    assert (settings.kafka_sasl_password, settings.event_log_namespace, settings.kafka_replication_factor) == (
        "sasl-pw", "prod", 3)


def test_each_process_is_probed_where_it_serves_its_health(tmp_path):
    docs = render(tmp_path, REQUIRED)
    for deployment in deployments(docs):
        container = main_container(deployment)
        name, env = served(container)[0], environment(container, docs)
        # The API serves /healthz and /readyz on its own port; every other process beside its metrics.
        port = int(env["LEDGERLM_METRICS_PORT"] if PROCESSES[name].metrics else env["LEDGERLM_API_PORT"])
        assert env["LEDGERLM_METRICS_HOST" if PROCESSES[name].metrics else "LEDGERLM_API_HOST"] == "0.0.0.0"
        assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": port}, name
        assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": port}, name
        assert [p["containerPort"] for p in container["ports"]] == [port]
        if name in ("worker", "batch-worker"):  # an engine loads and warms before anything answers
            assert container["startupProbe"]["failureThreshold"] * container["startupProbe"]["periodSeconds"] >= 600
    (service,) = [doc for doc in docs if doc["kind"] == "Service"]
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "api"


def test_compose_and_the_chart_run_the_same_processes_with_the_same_environment(tmp_path):
    compose = compose_services()
    docs = render(tmp_path, FULL)
    assert sorted(compose) == sorted(served(main_container(d))[0] for d in deployments(docs))
    known = known_settings()
    for deployment in deployments(docs):
        container = main_container(deployment)
        name = served(container)[0]
        set_here, passed_on = compose_env(compose[name])
        assert (set_here | passed_on) <= known, f"compose {name}: not a setting: {(set_here | passed_on) - known}"
        names = set(environment(container, docs))
        assert names == set_here | passed_on, f"{name}: chart {sorted(names)}; compose {sorted(set_here | passed_on)}"
    compose_gpus = {name for name, s in compose.items() if "deploy" in s}
    chart_gpus = {served(main_container(d))[0] for d in deployments(docs)
                  if GPU in main_container(d).get("resources", {}).get("limits", {})}
    assert compose_gpus == chart_gpus == {"worker", "batch-worker"}
