"""Rollback under steady load: how long after a rollback the candidate still gets new requests.

    set -a && . .local/services.env && set +a
    .venv/bin/python tests/perf/bench_rollback.py [--log embedded|kafka] [--rounds 5] [--rate 10]

The platform runs as deployed (`tests/perf/deployed.py`): API, admission and one worker of
the stable revision, plus one worker of a candidate revision (the same fake engine under
another config hash), each a fake engine of `--token-ms` a token. A client here sends
`--rate` non-streamed requests a second, open loop, each naming a new `user`. Each round
starts a canary at `--weight` percent, lets it run `--hold` s, then rolls it back through
`POST /v1/admin/rollouts/ALIAS/rollback`, and goes on `--hold` s more. Reported from the
log: for each round, the time from the `RolloutRolledBack` event to the last request the
candidate got (a `GenerationRequested` of its arm, stamped after it; 0 when none); and,
from the client, any answer that was not a 200 during the rounds (there should be none).
Appends the table to the "Rollback" section of tests/perf/RESULTS.md (`--no-record` to skip).
"""
from __future__ import annotations

import argparse
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from tests.perf.bench_failover import kafka_url  # noqa: E402
from tests.perf.bench_noisy_neighbour import bench_topics_cleared, percentile  # noqa: E402
from tests.perf.results import record_run  # noqa: E402

SECTION = "## Rollback"


def run(args) -> dict:
    import httpx

    from models import topics
    from models.events import decode
    from tests.harness import MODEL_ALIAS, new_tenant
    from tests.helpers import Launched, wait_until
    from tests.perf.deployed import deployed
    from workers.tiny_model import make_tiny_model

    home = Path(tempfile.mkdtemp(prefix="bench-rollback-"))
    model = make_tiny_model(home / "tiny", seed=0)
    environment = {"LEDGERLM_ENGINE_FACTORY": "tests.slow_engine:SlowEngine.from_settings", "LEDGERLM_CPUS": "all",
                   "LEDGERLM_TEST_TOKEN_PAUSE_S": str(args.token_ms / 1000)}
    answers: Counter = Counter()
    rounds: list[dict] = []
    with deployed(args.log, model, home / "platform", max_seqs=args.max_seqs, take_ahead=0, stream_linger_ms=0,
                  environment=environment) as platform:
        stable = platform.view.refresh().aliases[MODEL_ALIAS].model_revision
        candidate_env = {**platform.env, "LEDGERLM_TEST_ENGINE_HASH": "slow-engine-candidate",
                         "LEDGERLM_MODEL_ALIAS": "rollback-candidate"}
        subprocess.run([sys.executable, "-m", "workers", "model", "approve"], env=candidate_env, check=True,
                       timeout=300, capture_output=True)
        candidate = platform.view.refresh().aliases["rollback-candidate"].model_revision
        _, operator = new_tenant(platform.view, actor="bench", scopes=("admin",))
        _, secret = platform.tenant()
        with Launched([sys.executable, "-m", "workers", "serve", "worker", "--alias", "rollback-candidate"],
                      env=candidate_env, log=home / "candidate.log", ready='"ready": true', ready_s=300,
                      stop_s=30) as worker, \
                httpx.Client(base_url=platform.base_url, timeout=60,
                             headers={"Authorization": f"Bearer {secret}"}) as client, \
                httpx.Client(base_url=platform.base_url, timeout=60,
                             headers={"Authorization": f"Bearer {operator}"}) as ops, \
                ThreadPoolExecutor(32) as pool:
            wait_until(lambda: client.get(f"/v1/models/{MODEL_ALIAS}").status_code == 200, 60, what="the API")
            stop = threading.Event()

            def one() -> None:
                r = client.post("/v1/generations", json={"model_alias": MODEL_ALIAS, "input": "hello",
                                                         "max_output_tokens": args.tokens, "ignore_eos": True,
                                                         "stream": False, "user": uuid.uuid4().hex})
                answers[str(r.status_code) if r.status_code == 200 else f"{r.status_code} {r.text[:80]}"] += 1

            def offer() -> None:
                start, i = time.monotonic(), 0
                while not stop.is_set():
                    stop.wait(max(0.0, start + i / args.rate - time.monotonic()))  # the load's pace
                    pool.submit(one)
                    i += 1
            loader = threading.Thread(target=offer, daemon=True)
            loader.start()
            try:
                stop.wait(args.hold)
                for _ in range(args.rounds):
                    started = ops.post("/v1/admin/rollouts", json={
                        "alias": MODEL_ALIAS, "candidate_revision": candidate, "steps": [args.weight, 100],
                        "step_duration_s": 3600})
                    assert started.status_code == 201, started.text
                    stop.wait(args.hold)
                    back = ops.post(f"/v1/admin/rollouts/{MODEL_ALIAS}/rollback", json={"reason": "bench"})
                    assert back.status_code == 200, back.text
                    rounds.append({"rollout_id": started.json()["rollout_id"]})
                    stop.wait(args.hold)
            finally:
                stop.set()
                loader.join(10)
            worker.check()
        ended = {}
        for record in platform.log.read_topic(topics.ADMIN.name):
            env = decode(record.value)
            if env.event_type == "RolloutRolledBack":
                ended[env.payload.rollout_id] = env.occurred_at
        last: dict[str, float] = {}
        counts: Counter = Counter()
        for record in platform.log.read_topic(topics.REQUESTS.name):
            env = decode(record.value)
            p = env.payload
            if env.event_type == "GenerationRequested" and p.rollout_id in ended:
                counts[(p.rollout_id, p.rollout_arm)] += 1
                if p.rollout_arm == "candidate":
                    lag = (env.occurred_at - ended[p.rollout_id]).total_seconds()
                    last[p.rollout_id] = max(last.get(p.rollout_id, 0.0), lag)
        for r in rounds:
            r.update(after_s=max(0.0, last.get(r["rollout_id"], 0.0)),
                     candidate=counts[(r["rollout_id"], "candidate")], stable=counts[(r["rollout_id"], "stable")])
    shutil.rmtree(home, ignore_errors=True)
    return {"stable": stable, "candidate": candidate, "rounds": rounds, "answers": dict(answers)}


def table(found: dict) -> str:
    lags = [r["after_s"] for r in found["rounds"]]
    lines = ["| round | requests to candidate / stable | rollback to the candidate's last new request |",
             "|---:|---:|---:|"]
    lines += [f"| {i + 1} | {r['candidate']} / {r['stable']} | {r['after_s'] * 1000:.0f} ms |"
              for i, r in enumerate(found["rounds"])]
    others = ", ".join(f"{n} × {k}" for k, n in found["answers"].items() if k != "200") or "none"
    lines += ["", f"max {max(lags) * 1000:.0f} ms, p99 {percentile(lags, 0.99) * 1000:.0f} ms over "
                  f"{len(lags)} rollbacks; answers {found['answers'].get('200', 0)} × 200, others: {others}"]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--log", choices=["embedded", "kafka"], default="embedded")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rate", type=float, default=10.0, help="requests per second")
    parser.add_argument("--weight", type=float, default=50.0, help="the canary's share, percent")
    parser.add_argument("--hold", type=float, default=4.0, help="seconds before and after each rollback")
    parser.add_argument("--token-ms", type=float, default=10.0)
    parser.add_argument("--tokens", type=int, default=10)
    parser.add_argument("--max-seqs", type=int, default=8)
    parser.add_argument("--no-record", action="store_true")
    args = parser.parse_args()
    if args.log == "kafka":
        kafka_url()
    with bench_topics_cleared(args.log):
        found = run(args)
    text = table(found)
    print(text)
    if not args.no_record:
        record_run(SECTION, ".venv/bin/python tests/perf/bench_rollback.py " + shlex.join(sys.argv[1:]),
                   f"{args.log} log; API, admission, a worker of the stable revision and one of the candidate "
                   f"(fake engines of {args.token_ms:g} ms a token), {args.rate:g} requests/s of {args.tokens} "
                   f"tokens, each from a new user; {args.rounds} canaries at {args.weight:g} % held {args.hold:g} s, "
                   f"each then rolled back over HTTP", text)


if __name__ == "__main__":
    main()
