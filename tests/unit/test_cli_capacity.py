"""`ledgerlm capacity plan` as a user runs it: the seed's example prints its working and
figures (and the same as JSON), model shapes come from real model directories (the tiny
model, SmolLM2), the per-replica figure from a load test result file, and bad input gets
a message naming it and exit status 2. Memory is counted in GiB, as the engine counts its
KV cache; a load test that never saturated the service is refused unless allowed."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from api.cli.main import main

pytest_plugins = ["tests.small_model_fixture"]

ROOT = Path(__file__).resolve().parents[2]
SEED = ["capacity", "plan", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--dtype", "fp16",
        "--context-tokens", "4000", "--gpu-memory-gb", "80", "--gpus", "2", "--weights-gb", "140",
        "--peak-rps", "100", "--output-tokens", "300", "--per-replica-tokens-per-s", "2500",
        "--price-per-replica-hour", "3"]
THROUGHPUT = ["capacity", "plan", "--peak-rps", "100", "--output-tokens", "300"]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    """The command's exit status, stdout and stderr; argparse's refusals exit by SystemExit."""
    try:
        code = main(list(argv))
    except SystemExit as exc:
        code = exc.code
    out = capsys.readouterr()
    return code, out.out, out.err


def plan_json(capsys, *argv: str) -> dict:
    code, out, err = run(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def test_the_seeds_example_shows_its_working(capsys):
    code, out, err = run(capsys, *SEED)
    assert (code, err) == (0, "")
    for line in [
        "2 × 80 layers × 8 KV heads × 128 head dim × 2 bytes (fp16) = 327,680 bytes (320 KiB)",
        "KV cache per replica (GiB = 2^30 bytes)",
        "327,680 bytes × 4,000 tokens = 1.22 GiB",
        "2 GPUs × 80 GiB − 140 GiB of weights = 20 GiB",
        "20 GiB ÷ 1.22 GiB = 16.38, so 16 concurrent sequences of 4,000 tokens (65,536 tokens in all)",
        "100 requests/s × 300 output tokens = 30,000 output tokens/s",
        "2,500 output tokens/s at the SLO (given)",
        "30,000 ÷ 2,500 = 12, so 12 replicas at 100 %",
        "30,000 ÷ (2,500 × 0.7 = 1,750) = 17.14, so 18 replicas",
        "17 × 2,500 × 0.7 = 29,750 < 30,000, so 18 + 1 = 19 replicas",
        "18 × 2,500 × 0.7 = 31,500 ≥ 30,000",
        "plan:         19 replicas",
        "19 replicas × 730 h × $3 per replica-hour = $41,610 a month",
    ]:
        assert line in out, f"{line!r} not in:\n{out}"


def test_the_seeds_example_as_json(capsys):
    doc = plan_json(capsys, *SEED)
    kv, replicas = doc["kv"], doc["replicas"]
    assert (kv["bytes_per_token"], kv["bytes_per_sequence"], kv["kv_budget_bytes"], kv["concurrent_sequences"]) \
        == (327_680, 1_310_720_000, 20 * 2**30, 16)
    assert (replicas["demand_tokens_per_s"], replicas["floor_replicas"], replicas["ceiling_replicas"],
            replicas["survivors_tokens_per_s"], replicas["replicas"], replicas["monthly_cost"]) \
        == (30_000, 12, 18, 29_750, 19, 41_610)
    assert doc["per_replica_source"] == "given" and doc["units"] == {"GiB": 2**30, "hours_per_month": 730}


def test_memory_flags_take_gib_under_either_spelling(capsys):
    # The engine reads LEDGERLM_KV_CACHE_GB=0.25 as 0.25 × 2^30 bytes; the plan counts the same.
    argv = ["capacity", "plan", "--layers", "2", "--kv-heads", "1", "--head-dim", "64", "--dtype", "fp32",
            "--context-tokens", "512"]
    for flag in ("--kv-budget-gb", "--kv-budget-gib"):
        assert plan_json(capsys, *argv, flag, "0.25")["kv"]["kv_budget_bytes"] == 2**28
    kv = plan_json(capsys, *argv, "--gpu-memory-gib", "1", "--weights-gib", "0.5")["kv"]
    assert (kv["gpu_memory_bytes"], kv["weights_bytes"], kv["kv_budget_bytes"]) == (2**30, 2**29, 2**29)
    code, out, _ = run(capsys, *argv, "--kv-budget-gb", "0.25")
    assert code == 0 and "KV budget:    0.25 GiB (given)" in out
    assert "0.25 GiB ÷ 0.5 MiB = 512, so 512 concurrent sequences" in out


def test_ceiling_and_failures_change_the_plan(capsys):
    args = [*THROUGHPUT, "--per-replica-tokens-per-s", "2500"]
    assert plan_json(capsys, *args, "--failures", "2")["replicas"]["replicas"] == 20
    assert plan_json(capsys, *args, "--failures", "0")["replicas"]["replicas"] == 18
    assert plan_json(capsys, *args, "--ceiling", "80%")["replicas"]["replicas"] == 16  # 30,000 / 2,000 = 15, + 1
    code, out, _ = run(capsys, *args, "--failures", "0")
    assert code == 0 and "0 lost:       none reserved: 18 replicas" in out and "Cost" not in out


def test_the_tiny_models_directory(capsys, tiny_model_dir):
    # 2 × 2 layers × 1 KV head × 64 head dim × 4 bytes (float32) = 1,024 bytes a token.
    doc = plan_json(capsys, "capacity", "plan", "--model-dir", str(tiny_model_dir), "--context-tokens", "512",
                    "--kv-budget-gb", "0.125")
    kv = doc["kv"]
    assert (kv["layers"], kv["kv_heads"], kv["head_dim"], kv["dtype"], kv["bytes_per_token"]) \
        == (2, 1, 64, "float32", 1024)
    assert kv["concurrent_sequences"] == 2**27 // (1024 * 512) == 256
    assert doc["replicas"] is None
    # Without --weights-gb, the weights are the size of the directory's weight files.
    weights = (tiny_model_dir / "model.safetensors").stat().st_size
    code, out, _ = run(capsys, "capacity", "plan", "--model-dir", str(tiny_model_dir), "--context-tokens", "512",
                       "--gpu-memory-gb", "1", "--dtype", "bf16")
    assert code == 0 and "(the model directory's weight files)" in out and "2 bytes (bf16) = 512 bytes" in out
    assert f"{(2**30 - weights) // (512 * 512):,} concurrent sequences of 512 tokens" in out


def test_smollm2s_directory(capsys, small_model_dir):
    # SmolLM2-135M: 30 layers, 3 KV heads of 64, stored and served in float32.
    doc = plan_json(capsys, "capacity", "plan", "--model-dir", str(small_model_dir), "--context-tokens", "8192",
                    "--gpu-memory-gb", "16")
    kv = doc["kv"]
    assert (kv["layers"], kv["kv_heads"], kv["head_dim"], kv["dtype"]) == (30, 3, 64, "float32")
    assert kv["bytes_per_token"] == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv["weights_bytes"] == (small_model_dir / "model.safetensors").stat().st_size
    assert kv["concurrent_sequences"] == (16 * 2**30 - kv["weights_bytes"]) // (46_080 * 8192)


def loadtest_result(path: Path, *, replicas: int = 2, meets: bool = True, saturated: bool = True) -> Path:
    """A result as `ledgerlm loadtest` writes it: steps numbered from 1; the third broke the
    SLO, or (not `saturated`) the sweep ended at its second, which met it."""
    def step(number: int, rate: float, goodput: float, ok: bool) -> dict:
        latency = {"p50": 20.0, "p95": 40.0, "p99": 60.0}
        return {"step": number, "mode": "rate", "rate": rate, "concurrency": None, "duration_s": 30.0, "requests": int(rate * 30),
                "requests_per_s": rate, "output_tokens_per_s": goodput * 1.05, "goodput_requests_per_s": rate,
                "goodput_output_tokens_per_s": goodput, "meets_slo": ok, "ttft_ms": latency, "tpot_ms": latency,
                "itl_ms": latency, "e2e_ms": latency, "rejections": {"shed": 3}, "failures": 0, "per_tenant": {}}
    doc = {"target": "http://127.0.0.1:8000/v1", "model": "tiny", "replicas": replicas,
           "slo": {"ttft_p95_ms": 500.0, "tpot_p95_ms": None},
           "steps": [step(1, 4, 2400, meets), step(2, 8, 5000, meets), step(3, 16, 7000, False)],
           "knee": 2 if meets else None, "knee_reason": "slo broken at step 3" if meets else "slo broken at step 1"}
    if not saturated:
        doc["steps"], doc["knee_reason"] = doc["steps"][:2], "sweep ended"
    path.write_text(json.dumps(doc))
    return path


def test_the_per_replica_figure_from_a_load_test(capsys, tmp_path):
    file = loadtest_result(tmp_path / "result.json")
    args = [*THROUGHPUT, "--from-loadtest", str(file), "--price-per-replica-hour", "3"]
    code, out, err = run(capsys, *args)
    assert (code, err) == (0, "")
    assert "5,000 output tokens/s goodput (ttft_p95_ms ≤ 500)" in out  # not 7,000: that step broke the SLO
    assert "step 2 of 3 (rate 8 requests/s), the best of 2 that met the SLO, on 2 replicas" in out
    assert "5,000 ÷ 2 = 2,500 output tokens/s at the SLO" in out
    assert "= $41,610 a month" in out
    doc = plan_json(capsys, *args)
    assert doc["replicas"]["replicas"] == 19
    assert doc["per_replica_source"]["loadtest_file"] == str(file)
    assert doc["per_replica_source"]["per_replica_tokens_per_s"] == 2500


def test_a_load_test_that_never_saturated_is_refused_unless_allowed(capsys, tmp_path):
    file = loadtest_result(tmp_path / "unsaturated.json", saturated=False)
    args = [*THROUGHPUT, "--from-loadtest", str(file)]
    code, out, err = run(capsys, *args)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1, err
    assert "did not reach saturation" in err and "step 2 of 2, rate 8 requests/s" in err
    assert "overstate the replicas" in err and "--allow-unsaturated" in err
    code, out, err = run(capsys, *args, "--allow-unsaturated")
    assert code == 0 and "plan:         19 replicas" in out
    assert err.startswith("ledgerlm capacity plan: warning: ") and "did not reach saturation" in err
    assert "unsaturated:  the test never saturated the service" in out
    doc = plan_json(capsys, *args, "--allow-unsaturated")
    assert "did not reach saturation" in doc["per_replica_source"]["unsaturated"]
    assert doc["per_replica_source"]["step"] == 2


def test_the_plan_numbers_the_best_step_as_the_load_test_does(capsys, tmp_path):
    from api.cli.loadtest import summary

    file = loadtest_result(tmp_path / "result.json")
    result = json.loads(file.read_text())
    table = summary(result)
    assert table.splitlines()[0].endswith("knee at step 2 (slo broken at step 3)")
    row = next(line for line in table.splitlines() if line.split()[1] == "8/s")
    assert row.split()[0] == "2"
    code, out, _ = run(capsys, *THROUGHPUT, "--from-loadtest", str(file))
    assert code == 0 and "step 2 of 3 (rate 8 requests/s)" in out


@pytest.mark.parametrize("argv, words", [
    ([*THROUGHPUT, "--from-loadtest", "{missing}"], "cannot read the load test result"),
    ([*THROUGHPUT, "--from-loadtest", "{no_slo}"], "no step of the load test met its SLO"),
    ([*THROUGHPUT, "--from-loadtest", "{not_json}"], "is not JSON"),
    ([*THROUGHPUT, "--per-replica-tokens-per-s", "2500", "--from-loadtest", "{no_slo}"], "per-replica goodput"),
    ([*THROUGHPUT], "per-replica goodput"),
    (["capacity", "plan", "--peak-rps", "-100", "--output-tokens", "300"], "must be a positive number, not -100"),
    (["capacity", "plan", "--peak-rps", "ten"], "not a number: ten"),
    ([*THROUGHPUT, "--per-replica-tokens-per-s", "2500", "--ceiling", "70"], "at most 1"),
    ([*THROUGHPUT, "--per-replica-tokens-per-s", "2500", "--failures", "-1"], "zero or more"),
    ([*THROUGHPUT, "--per-replica-tokens-per-s", "2500", "--price-per-replica-hour", "-3"], "zero or more"),
    (SEED[:14] + ["--weights-gb", "170"], "no room is left for the KV cache"),
    (["capacity", "plan", "--model-dir", "{missing}", "--context-tokens", "4000", "--kv-budget-gb", "20"],
     "cannot read the model config"),
    (["capacity", "plan", "--layers", "80", "--context-tokens", "4000", "--kv-budget-gb", "20"],
     "needs --kv-heads, --head-dim"),
    (["capacity", "plan", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--kv-budget-gb", "20"],
     "needs --context-tokens"),
    (["capacity", "plan", "--layers", "80", "--kv-heads", "8", "--head-dim", "128", "--dtype", "fp13",
      "--context-tokens", "4000", "--kv-budget-gb", "20"], "unknown dtype 'fp13'"),
    (["capacity", "plan"], "nothing to plan"),
])
def test_bad_input_is_refused_with_status_2(capsys, tmp_path, argv, words):
    files = {"missing": tmp_path / "absent.json", "no_slo": loadtest_result(tmp_path / "no-slo.json", meets=False),
             "not_json": tmp_path / "truncated.json"}
    files["not_json"].write_text('{"steps": [')
    code, out, err = run(capsys, *(a.format(**files) for a in argv))
    assert code == 2 and out == ""
    assert "error:" in err and words in err, err


def test_the_installed_command_exits_2_on_bad_input_and_0_on_the_seed():
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    bad = subprocess.run([sys.executable, "-m", "api.cli", *THROUGHPUT, "--per-replica-tokens-per-s", "-1"],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "must be a positive number, not -1" in bad.stderr
    good = subprocess.run([sys.executable, "-m", "api.cli", *SEED], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert good.returncode == 0 and "= $41,610 a month" in good.stdout


def test_the_documented_example_is_what_the_command_prints(capsys):
    section = (ROOT / "docs" / "capacity.md").read_text().split("## A worked example\n", 1)[1]
    command, printed = [block.split("\n", 1)[1] for block in section.split("```")[1:4:2]]
    argv = command.replace("\\\n", " ").split()
    assert argv[:3] == ["ledgerlm", "capacity", "plan"]
    code, out, _ = run(capsys, *argv[1:])
    assert code == 0 and out == printed
