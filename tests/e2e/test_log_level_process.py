"""`ledgerlm serve worker` with its real engine: at LEDGERLM_LOG_LEVEL=WARNING it prints no
INFO line, neither its own nor vLLM's (in the worker or its engine core); at INFO it does."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.harness import MODEL_ALIAS
from tests.helpers import Launched

INFO_LINE = re.compile(r"(^|\) )INFO[ :]", re.MULTILINE)  # vLLM's "INFO 12-07 ..." (its core's "(EngineCore pid=1) INFO"), Python's "INFO:name:"


@pytest.mark.parametrize("level", ["WARNING", "INFO"])
def test_the_worker_prints_info_lines_only_at_info(tiny_model_dir, tmp_path, own_vllm, level):
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if key not in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE", "VLLM_LOGGING_LEVEL")}
    env.update({"PYTHONUNBUFFERED": "1", "LEDGERLM_HOME": str(home), "LEDGERLM_MODEL": str(tiny_model_dir),
                "LEDGERLM_MODEL_ALIAS": MODEL_ALIAS, "LEDGERLM_MAX_MODEL_LEN": "512", "LEDGERLM_KV_CACHE_GB": "0.125",
                "LEDGERLM_ENGINE_MAX_SEQS": "4", "LEDGERLM_CPUS": "all", "LEDGERLM_WORKER_ADMITS": "0",
                "LEDGERLM_LOG_LEVEL": level})
    subprocess.run([sys.executable, "-m", "workers", "model", "approve"], env=env, check=True, timeout=600,
                   capture_output=True)
    with Launched([sys.executable, "-m", "api.cli", "serve", "worker"], env=env, log=tmp_path / "worker.log",
                  ready='"ready": true', ready_s=300, stop_s=30) as worker:
        pass
    output = worker.output()
    if level == "WARNING":
        assert not INFO_LINE.search(output), output[-4000:]
    else:
        assert INFO_LINE.search(output), output[-4000:]
