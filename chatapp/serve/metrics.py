"""``GET /metrics``: the server's figures in Prometheus' text format (``prometheus_client``), in a
registry of the server's own.

- ``specchat_requests_total{endpoint, status}``: answered requests by HTTP status;
- ``specchat_queue_waiting``, ``specchat_generating``: requests waiting, and running (0 or 1);
- ``specchat_prompt_tokens_total``, ``specchat_completion_tokens_total``;
- ``specchat_drafted_tokens_total{source}``, ``specchat_accepted_tokens_total{source}``: per
  source family (prediction, edit, suffix, ngram, model);
- ``specchat_time_per_output_token_seconds``: per reply, decode time / tokens (prompt excluded);
- ``specchat_time_to_first_token_seconds``: per reply, as the engine measured it.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.exposition import generate_latest

from chatapp.api.exchange import ExchangeResult

CONTENT_TYPE = CONTENT_TYPE_LATEST
_TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)
_TTFT_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0, 5.0, 10.0, 30.0)


class ServeMetrics:
    """The metrics of one server; ``waiting`` and ``generating`` are read at each scrape."""

    def __init__(self, waiting: Callable[[], float], generating: Callable[[], float]) -> None:
        self.registry = registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter("specchat_requests", "Answered requests by HTTP status",
                                ["endpoint", "status"], registry=registry)
        Gauge("specchat_queue_waiting", "Requests waiting for the engine",
              registry=registry).set_function(waiting)
        Gauge("specchat_generating", "Requests being generated (one at a time)",
              registry=registry).set_function(generating)
        self.prompt_tokens = Counter("specchat_prompt_tokens", "Prompt tokens of the replies",
                                     registry=registry)
        self.completion_tokens = Counter("specchat_completion_tokens", "Tokens generated",
                                         registry=registry)
        self.drafted = Counter("specchat_drafted_tokens", "Draft tokens proposed, by source",
                               ["source"], registry=registry)
        self.accepted = Counter("specchat_accepted_tokens", "Draft tokens accepted, by source",
                                ["source"], registry=registry)
        self.tpot = Histogram("specchat_time_per_output_token_seconds",
                              "Decode time per generated token of each reply",
                              buckets=_TPOT_BUCKETS, registry=registry)
        self.ttft = Histogram("specchat_time_to_first_token_seconds",
                              "Time to the first token of each reply", buckets=_TTFT_BUCKETS,
                              registry=registry)

    def answered(self, endpoint: str, status: int) -> None:
        self.requests.labels(endpoint, str(status)).inc()

    def reply(self, result: ExchangeResult) -> None:
        """Count a finished reply."""
        stats = result.stats
        self.prompt_tokens.inc(stats.prompt_tokens)
        self.completion_tokens.inc(stats.tokens)
        for source, counts in result.sources.items():
            self.drafted.labels(source).inc(counts.drafted)
            self.accepted.labels(source).inc(counts.accepted)
        if stats.tokens:
            self.tpot.observe(max(0.0, stats.total_s - stats.prompt_s) / stats.tokens)
            self.ttft.observe(stats.ttft_s)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
