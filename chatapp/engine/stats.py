"""Per-turn statistics of speculative decoding, with the definitions used by vLLM and friends.

- drafted / accepted: draft tokens proposed, and of those accepted by the target.
- acceptance_rate = accepted / drafted (0 when nothing was drafted).
- mean_accepted_length = emitted tokens per target forward (1 + accepted / steps when no stop cut
  a step short).
- per_position_accepted[i]: of the steps that verified a draft at position i+1, the fraction that
  accepted it.
- threads: the CPU threads the target's evaluations used at the end of the turn (0: unknown).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class TurnStats:
    tokens: int = 0
    prompt_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    per_position_accepted: tuple[float, ...] = ()
    draft_s: float = 0.0
    verify_s: float = 0.0
    prompt_s: float = 0.0
    total_s: float = 0.0
    ttft_s: float = 0.0
    threads: int = 0

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        return self.tokens / self.target_calls if self.target_calls else 0.0

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.total_s if self.total_s > 0 else 0.0

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prompt_s if self.prompt_s > 0 else 0.0

    @property
    def other_s(self) -> float:
        """Time not spent in the draft, the verification or the prompt: sampling, bookkeeping."""
        return max(0.0, self.total_s - self.draft_s - self.verify_s - self.prompt_s)

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["per_position_accepted"] = list(self.per_position_accepted)
        data.update(
            acceptance_rate=self.acceptance_rate,
            mean_accepted_length=self.mean_accepted_length,
            tokens_per_s=self.tokens_per_s,
            prompt_tokens_per_s=self.prompt_tokens_per_s,
            other_s=self.other_s,
        )
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "TurnStats":
        names = {f for f in cls.__dataclass_fields__}
        kwargs = {k: v for k, v in data.items() if k in names}
        kwargs["per_position_accepted"] = tuple(kwargs.get("per_position_accepted", ()))
        return cls(**kwargs)


def decode_tokens_per_s(stats: TurnStats) -> float:
    """Tokens per second of generation, the prompt's processing left out."""
    decode_s = stats.total_s - stats.prompt_s
    return stats.tokens / decode_s if decode_s > 0 else 0.0


def is_target_only(stats: TurnStats) -> bool:
    """A turn decoded by the target alone (K = 0 throughout): the baseline for the speedup."""
    return stats.drafted == 0 and stats.target_calls > 0 and stats.tokens > 0


@dataclass(frozen=True)
class ReplayStats:
    """A reply decoded again by the target alone (K = 0, same prompt, as many tokens): what
    speculation bought on this reply on this machine. Speeds are decode tok/s (prompt left out)."""

    plain_tps: float
    speculative_tps: float
    tokens: int

    @property
    def speedup(self) -> float:
        return self.speculative_tps / self.plain_tps if self.plain_tps > 0 else 0.0

    def summary(self) -> str:
        return (f"plain replay: {self.plain_tps:.1f} tok/s, speculation: "
                f"{self.speculative_tps:.1f} tok/s, speedup {self.speedup:.2f}x")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "ReplayStats":
        return cls(float(data["plain_tps"]), float(data["speculative_tps"]), int(data["tokens"]))


@dataclass
class SourceTally:
    """What one drafting source (or family of sources) did in a reply: the steps it drafted, the
    tokens it drafted and had accepted, and the seconds its drafting took."""

    steps: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0

    def add(self, drafted: int, accepted: int, draft_s: float) -> None:
        """Count one step where this source drafted ``drafted`` tokens."""
        self.steps += 1
        self.drafted += drafted
        self.accepted += accepted
        self.draft_s += draft_s


@dataclass
class StatsRecorder:
    """Mutable accumulator the engine fills during a turn; ``snapshot`` freezes it."""

    tokens: int = 0
    prompt_tokens: int = 0
    drafted: int = 0
    accepted: int = 0
    target_calls: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prompt_s: float = 0.0
    ttft_s: float = 0.0
    verified_at: list[int] = field(default_factory=list)
    accepted_at: list[int] = field(default_factory=list)

    def record_step(self, drafted: int, accepted: int, draft_s: float, verify_s: float) -> None:
        self.target_calls += 1
        self.drafted += drafted
        self.accepted += accepted
        self.draft_s += draft_s
        self.verify_s += verify_s
        while len(self.verified_at) < drafted:
            self.verified_at.append(0)
            self.accepted_at.append(0)
        # Position i is verified when every earlier draft was accepted.
        for i in range(min(drafted, accepted + 1)):
            self.verified_at[i] += 1
            self.accepted_at[i] += i < accepted

    def snapshot(self, total_s: float, threads: int = 0) -> TurnStats:
        per_position = tuple(
            a / v if v else 0.0 for a, v in zip(self.accepted_at, self.verified_at)
        )
        return TurnStats(
            tokens=self.tokens,
            prompt_tokens=self.prompt_tokens,
            drafted=self.drafted,
            accepted=self.accepted,
            target_calls=self.target_calls,
            per_position_accepted=per_position,
            draft_s=self.draft_s,
            verify_s=self.verify_s,
            prompt_s=self.prompt_s,
            total_s=total_s,
            ttft_s=self.ttft_s,
            threads=threads,
        )


def format_summary(stats: TurnStats) -> str:
    """One paragraph for people: speed, latency, speculation and where the time went."""
    parts = [
        f"{stats.tokens} tokens in {stats.total_s:.2f} s ({stats.tokens_per_s:.1f} tok/s), "
        f"first token after {stats.ttft_s:.2f} s; prompt {stats.prompt_tokens} tokens "
        f"({stats.prompt_tokens_per_s:.0f} tok/s)."
    ]
    if stats.drafted:
        positions = " ".join(f"{rate:.0%}" for rate in stats.per_position_accepted)
        parts.append(
            f"Drafted {stats.drafted}, accepted {stats.accepted} ({stats.acceptance_rate:.0%}); "
            f"{stats.mean_accepted_length:.2f} tokens per target call over {stats.target_calls} "
            f"calls; acceptance by position: {positions}."
        )
    threads = f" on {stats.threads} thread{'s' if stats.threads != 1 else ''}" \
        if stats.threads else ""
    parts.append(
        f"Time{threads}: draft {stats.draft_s:.2f} s, verify {stats.verify_s:.2f} s, "
        f"prompt {stats.prompt_s:.2f} s, other {stats.other_s:.2f} s."
    )
    return " ".join(parts)
