"""Several engine processes serving one port: with PROMETHEUS_MULTIPROC_DIR a scrape adds them up."""
from __future__ import annotations

import os
import subprocess
import sys

from prometheus_client.parser import text_string_to_metric_families

WORKER = """
import sys
from shrike.engine.async_engine import EngineLoad
from shrike.server.metrics import ServerMetrics
running = int(sys.argv[1])
metrics = ServerMetrics("m", lambda: EngineLoad(running_requests=running, kv_cache_usage=running / 10,
                                                 prefix_cache_hits=5 * running))
metrics.on_admitted(100 * running)
metrics.on_tokens(3, 0.02, None)
metrics.on_finished("stop", 1.0)
if len(sys.argv) > 2:
    print(metrics.render().decode())
else:
    metrics.close()  # as the server does when it stops
"""


def test_a_scrape_sums_every_process(tmp_path):
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(tmp_path)}
    for running in (1, 2):
        subprocess.run([sys.executable, "-c", WORKER, str(running)], env=env, check=True)
    # A third process, still serving, answers the scrape.
    text = subprocess.run([sys.executable, "-c", WORKER, "4", "print"], env=env, check=True, capture_output=True,
                          text=True).stdout
    samples = {(s.name, s.labels.get("finished_reason")): s.value
               for family in text_string_to_metric_families(text) for s in family.samples}
    assert samples[("shrike:prompt_tokens_total", None)] == 700
    assert samples[("shrike:generation_tokens_total", None)] == 9
    assert samples[("shrike:request_success_total", "stop")] == 3
    assert samples[("shrike:prefix_cache_hits_total", None)] == 35
    assert samples[("shrike:time_to_first_token_seconds_count", None)] == 3
    # Gauges count only live processes: the two that stopped no longer do.
    assert samples[("shrike:num_requests_running", None)] == 4
    assert samples[("shrike:kv_cache_usage_perc", None)] == 0.4
