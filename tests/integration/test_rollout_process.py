"""`ledgerlm serve rollouts` as deployed: it starts on the configured log, acts on an open
rollout (a thin step past its time pauses as inconclusive), and stops cleanly on SIGTERM."""
from __future__ import annotations

import os
import sys

from pipelines.admin import commands as admin

from pipelines.rollouts import commands as rollouts
from pipelines.admin.commands import RegistryView
from pipelines.bootstrap import Bootstrap
from models.settings import Settings
from tests.helpers import Launched


def test_the_rollouts_process_pauses_a_thin_step_and_stops_on_sigterm(tmp_path):
    env = {k: v for k, v in os.environ.items() if k not in ("LEDGERLM_EVENT_LOG_URL", "LEDGERLM_EVENT_LOG_NAMESPACE")}
    env.update(LEDGERLM_HOME=str(tmp_path), PYTHONUNBUFFERED="1")
    settings = Settings(home=tmp_path)
    with Bootstrap(settings).event_log() as log:
        view = RegistryView(log)
        for revision in ("tiny@a", "tiny@b"):
            admin.approve_model(view, alias="chat", model_revision=revision, model_path="/m",
                                engine_config_hash=revision, max_model_len=512, actor="ops")
        admin.set_alias(view, alias="chat", model_revision="tiny@a", actor="ops")
        with Launched([sys.executable, "-m", "api.cli", "serve", "rollouts"], env=env, log=tmp_path / "rollouts.log",
                      ready='"rollouts": "ready"', ready_s=60, stop_s=30) as process:
            rollouts.start(view, alias="chat", candidate_revision="tiny@b", actor="ops", steps=(10.0, 100.0),
                           step_duration_s=1.0)
            paused = process.wait_until(lambda: (r := view.refresh().open_rollouts["chat"]).paused and r, 30,
                                        what="the thin step to pause")
            assert paused.paused == "inconclusive" and paused.history[-1]["actor"] == "rollout-analysis"
            assert process.stop() == 0, process.shown()
        view.close()
