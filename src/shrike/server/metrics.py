"""Prometheus metrics, named as vLLM names them with the `shrike:` prefix, in the text exposition format."""
from __future__ import annotations

import bisect
from collections.abc import Callable

from shrike.engine.async_engine import EngineLoad, GenerationObserver

# vLLM's buckets, so dashboards built for it read these the same way.
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{key}="{_escape(value)}"' for key, value in labels.items()) + "}"


def _number(value: float) -> str:
    return "+Inf" if value == float("inf") else repr(float(value))


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]):
        self.bounds = buckets
        self.counts = [0] * (len(buckets) + 1)  # the last one is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out, cumulative = [], 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts):
            cumulative += count
            out.append(f"{name}_bucket{_labels({**labels, 'le': _number(bound)})} {cumulative}")
        out.append(f"{name}_sum{_labels(labels)} {_number(self.total)}")
        out.append(f"{name}_count{_labels(labels)} {cumulative}")
        return out


class ServerMetrics(GenerationObserver):
    """Counts what the engine did; rendered on every scrape. Updated on the event loop only."""

    def __init__(self, model_name: str, engine_load: Callable[[], EngineLoad]):
        self.labels = {"model_name": model_name}
        self.engine_load = engine_load
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished_by_reason: dict[str, int] = {"stop": 0, "length": 0, "abort": 0, "error": 0}
        self.time_to_first_token = _Histogram(TIME_TO_FIRST_TOKEN_BUCKETS)
        self.inter_token_latency = _Histogram(INTER_TOKEN_LATENCY_BUCKETS)
        self.e2e_request_latency = _Histogram(REQUEST_LATENCY_BUCKETS)

    def on_admitted(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens += num_prompt_tokens

    def on_tokens(self, num_tokens: int, first_token_latency: float | None, inter_token_latency: float | None) -> None:
        self.generation_tokens += num_tokens
        if first_token_latency is not None:
            self.time_to_first_token.observe(first_token_latency)
        if inter_token_latency is not None:
            self.inter_token_latency.observe(inter_token_latency)

    def on_finished(self, finish_reason: str, e2e_latency: float) -> None:
        self.finished_by_reason[finish_reason] = self.finished_by_reason.get(finish_reason, 0) + 1
        self.e2e_request_latency.observe(e2e_latency)

    def render(self) -> str:
        load = self.engine_load()
        labels = self.labels
        lines: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: list[str]) -> None:
            lines.extend([f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", *samples])

        def sample(name: str, value: float, extra: dict[str, str] | None = None) -> str:
            return f"{name}{_labels({**labels, **(extra or {})})} {_number(value)}"

        family("shrike:num_requests_running", "gauge", "Requests with sequences in the running batch.",
               [sample("shrike:num_requests_running", load.running_requests)])
        family("shrike:num_requests_waiting", "gauge", "Requests waiting to be scheduled.",
               [sample("shrike:num_requests_waiting", load.waiting_requests)])
        family("shrike:kv_cache_usage_perc", "gauge", "Fraction of KV-cache blocks in use (1 = full).",
               [sample("shrike:kv_cache_usage_perc", load.kv_cache_usage)])
        family("shrike:kv_cache_blocks", "gauge", "KV-cache blocks in the pool.",
               [sample("shrike:kv_cache_blocks", load.num_blocks)])
        family("shrike:kv_cache_free_blocks", "gauge",
               "KV-cache blocks held by no sequence (cached prefixes count as free); all of them when idle.",
               [sample("shrike:kv_cache_free_blocks", load.num_free_blocks)])
        family("shrike:num_sequences_in_flight", "gauge",
               "Sequences admitted and not yet released by their request's handler (0 when idle).",
               [sample("shrike:num_sequences_in_flight", load.sequences_in_flight)])
        family("shrike:engine_steps_total", "counter", "Engine-loop iterations that had work.",
               [sample("shrike:engine_steps_total", load.num_steps)])
        family("shrike:engine_step_seconds_max", "gauge",
               "Longest engine-loop iteration since start (commands, one step, hand-over): its worst stall.",
               [sample("shrike:engine_step_seconds_max", load.longest_step_seconds)])
        family("shrike:num_preemptions_total", "counter", "Sequences preempted for lack of KV-cache blocks.",
               [sample("shrike:num_preemptions_total", load.num_preemptions)])
        family("shrike:prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
               [sample("shrike:prefix_cache_queries_total", load.prefix_cache_queries)])
        family("shrike:prefix_cache_hits_total", "counter", "Prompt tokens served from the prefix cache.",
               [sample("shrike:prefix_cache_hits_total", load.prefix_cache_hits)])
        family("shrike:prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
               [sample("shrike:prompt_tokens_total", self.prompt_tokens)])
        family("shrike:generation_tokens_total", "counter", "Generated tokens.",
               [sample("shrike:generation_tokens_total", self.generation_tokens)])
        family("shrike:request_success_total", "counter",
               "Finished sequences (one per choice) by finish reason; abort: the client left or the server stopped.",
               [sample("shrike:request_success_total", count, {"finished_reason": reason})
                for reason, count in self.finished_by_reason.items()])
        for name, histogram, help_text in [
            ("shrike:time_to_first_token_seconds", self.time_to_first_token, "Time from arrival to the first token."),
            ("shrike:inter_token_latency_seconds", self.inter_token_latency, "Time between successive outputs."),
            ("shrike:e2e_request_latency_seconds", self.e2e_request_latency, "Time from arrival to finish."),
        ]:
            family(name, "histogram", help_text, histogram.lines(name, labels))
        return "\n".join(lines) + "\n"
