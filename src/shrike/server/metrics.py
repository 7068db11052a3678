"""Prometheus metrics through prometheus_client, named as vLLM names them with the `shrike:` prefix.

Each server gets its own registry (several apps can live in one process, as in the tests) with the
standard process, platform and GC collectors. With PROMETHEUS_MULTIPROC_DIR set, values go to that
directory instead and a scrape sums every engine process serving the port (prometheus_client's
multiprocess mode).
"""
from __future__ import annotations

import os
from collections.abc import Callable

import prometheus_client
import prometheus_client.exposition
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client import multiprocess

from shrike.engine.async_engine import EngineLoad, GenerationObserver

# The classic text format: every metric name here is a legacy-valid one, so every scraper reads it.
CONTENT_TYPE = prometheus_client.exposition.CONTENT_TYPE_PLAIN_0_0_4

# vLLM's buckets, so dashboards built for it read these the same way.
TIME_TO_FIRST_TOKEN_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0,
                               7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
INTER_TOKEN_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                               10.0, 20.0, 40.0, 80.0)
REQUEST_LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0,
                           120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
FINISH_REASONS = ("stop", "length", "abort", "error")

# `_created` samples double every series without telling a dashboard anything (vLLM turns them off too).
prometheus_client.disable_created_metrics()


def multiprocess_dir() -> str | None:
    return os.environ.get("PROMETHEUS_MULTIPROC_DIR") or None


class ServerMetrics(GenerationObserver):
    """Counts what the engine did. Updated on the event loop; the engine's own figures are copied in as tokens
    arrive and at each scrape."""

    def __init__(self, model_name: str, engine_load: Callable[[], EngineLoad]):
        self.engine_load = engine_load
        self.prompt_tokens = 0  # also kept here for the periodic stats log line
        self.generation_tokens = 0
        self._engine_totals = EngineLoad()
        if multiprocess_dir():
            self._registry = None  # metrics write to the shared directory; scrapes collect from it
        else:
            self._registry = CollectorRegistry()
            prometheus_client.ProcessCollector(registry=self._registry)
            prometheus_client.PlatformCollector(registry=self._registry)
            prometheus_client.GCCollector(registry=self._registry)
        labels = ["model_name"]

        def gauge(name: str, help_text: str, mode: str) -> Gauge:
            return Gauge(name, help_text, labels, registry=self._registry, multiprocess_mode=mode).labels(model_name)

        def counter(name: str, help_text: str) -> Counter:
            return Counter(name, help_text, labels, registry=self._registry).labels(model_name)

        def histogram(name: str, help_text: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(name, help_text, labels, registry=self._registry, buckets=buckets).labels(model_name)

        self.running = gauge("shrike:num_requests_running", "Requests with sequences in the running batch.", "livesum")
        self.waiting = gauge("shrike:num_requests_waiting", "Requests waiting to be scheduled.", "livesum")
        self.kv_cache_usage = gauge("shrike:kv_cache_usage_perc", "Fraction of KV-cache blocks in use (1 = full).",
                                    "livemax")
        self.kv_cache_blocks = gauge("shrike:kv_cache_blocks", "KV-cache blocks in the pool.", "livesum")
        self.kv_cache_free_blocks = gauge(
            "shrike:kv_cache_free_blocks",
            "KV-cache blocks held by no sequence (cached prefixes count as free); all of them when idle.", "livesum")
        self.sequences_in_flight = gauge(
            "shrike:num_sequences_in_flight",
            "Sequences admitted and not yet released by their request's handler (0 when idle).", "livesum")
        self.engine_step_seconds_max = gauge(
            "shrike:engine_step_seconds_max",
            "Longest engine-loop iteration since start (commands, one step, hand-over): its worst stall.", "livemax")
        self.engine_steps = counter("shrike:engine_steps", "Engine-loop iterations that had work.")
        self.preemptions = counter("shrike:num_preemptions", "Sequences preempted for lack of KV-cache blocks.")
        self.prefix_queries = counter("shrike:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("shrike:prefix_cache_hits", "Prompt tokens served from the prefix cache.")
        self.prompt_tokens_counter = counter("shrike:prompt_tokens", "Prompt tokens of admitted requests.")
        self.generation_tokens_counter = counter("shrike:generation_tokens", "Generated tokens.")
        self.spec_drafts = counter("shrike:spec_decode_num_drafts",
                                   "Speculative decoding: sequence steps that verified proposed tokens.")
        self.spec_proposed = counter("shrike:spec_decode_num_draft_tokens", "Speculative decoding: proposed tokens.")
        self.spec_accepted = counter("shrike:spec_decode_num_accepted_tokens",
                                     "Speculative decoding: proposed tokens the target model accepted.")
        self.spec_emitted = counter("shrike:spec_decode_num_emitted_tokens",
                                    "Speculative decoding: tokens produced by verifying steps (accepted plus the "
                                    "target's own).")
        self.spec_acceptance_rate = gauge("shrike:spec_decode_draft_acceptance_rate",
                                          "Speculative decoding: accepted / proposed tokens since start.", "livemax")
        finished = Counter("shrike:request_success", "Finished sequences (one per choice) by finish reason; abort: "
                           "the client left or the server stopped.", ["model_name", "finished_reason"],
                           registry=self._registry)
        self.finished = {reason: finished.labels(model_name, reason) for reason in FINISH_REASONS}
        self._finished_family = finished
        self._model_name = model_name
        self.time_to_first_token = histogram("shrike:time_to_first_token_seconds",
                                             "Time from arrival to the first token.", TIME_TO_FIRST_TOKEN_BUCKETS)
        self.inter_token_latency = histogram("shrike:inter_token_latency_seconds", "Time between successive outputs.",
                                             INTER_TOKEN_LATENCY_BUCKETS)
        self.e2e_request_latency = histogram("shrike:e2e_request_latency_seconds", "Time from arrival to finish.",
                                             REQUEST_LATENCY_BUCKETS)

    def on_admitted(self, num_prompt_tokens: int) -> None:
        self.prompt_tokens += num_prompt_tokens
        self.prompt_tokens_counter.inc(num_prompt_tokens)

    def on_tokens(self, num_tokens: int, first_token_latency: float | None, inter_token_latency: float | None) -> None:
        self.generation_tokens += num_tokens
        self.generation_tokens_counter.inc(num_tokens)
        if first_token_latency is not None:
            self.time_to_first_token.observe(first_token_latency)
        if inter_token_latency is not None:
            self.inter_token_latency.observe(inter_token_latency)
        # Also here, not only at scrapes: in multiprocess mode a scrape reaches one process, not the others.
        self._sync_engine_load()

    def on_finished(self, finish_reason: str, e2e_latency: float) -> None:
        if finish_reason not in self.finished:
            self.finished[finish_reason] = self._finished_family.labels(self._model_name, finish_reason)
        self.finished[finish_reason].inc()
        self.e2e_request_latency.observe(e2e_latency)
        self._sync_engine_load()

    def _sync_engine_load(self) -> None:
        """The engine keeps running totals; counters only move forward by the difference since the last scrape."""
        load, last = self.engine_load(), self._engine_totals
        self.running.set(load.running_requests)
        self.waiting.set(load.waiting_requests)
        self.kv_cache_usage.set(load.kv_cache_usage)
        self.kv_cache_blocks.set(load.num_blocks)
        self.kv_cache_free_blocks.set(load.num_free_blocks)
        self.sequences_in_flight.set(load.sequences_in_flight)
        self.engine_step_seconds_max.set(load.longest_step_seconds)
        self.engine_steps.inc(max(0, load.num_steps - last.num_steps))
        self.preemptions.inc(max(0, load.num_preemptions - last.num_preemptions))
        self.prefix_queries.inc(max(0, load.prefix_cache_queries - last.prefix_cache_queries))
        self.prefix_hits.inc(max(0, load.prefix_cache_hits - last.prefix_cache_hits))
        self.spec_drafts.inc(max(0, load.spec_drafts - last.spec_drafts))
        self.spec_proposed.inc(max(0, load.spec_proposed_tokens - last.spec_proposed_tokens))
        self.spec_accepted.inc(max(0, load.spec_accepted_tokens - last.spec_accepted_tokens))
        self.spec_emitted.inc(max(0, load.spec_emitted_tokens - last.spec_emitted_tokens))
        if load.spec_proposed_tokens:
            self.spec_acceptance_rate.set(load.spec_accepted_tokens / load.spec_proposed_tokens)
        self._engine_totals = load

    def close(self) -> None:
        """At shutdown: in multiprocess mode this process's live gauges must stop counting."""
        if multiprocess_dir():
            multiprocess.mark_process_dead(os.getpid())

    def render(self) -> bytes:
        self._sync_engine_load()
        if self._registry is not None:
            return generate_latest(self._registry)
        registry = CollectorRegistry()
        multiprocess.MultiProcessCollector(registry)
        return generate_latest(registry)
