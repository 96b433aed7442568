"""`specchat bench --conversation`: a scripted multi-turn editing conversation, run as one chat.

The conversation (``chatapp/data/bench_conversation.json``) writes a function and then changes it
three times, the way people iterate with a coding assistant. It is one chat: the prompt of turn
n is the whole conversation so far (system prompt, every user turn, every reply) through the
model's chat template, and every turn's reply is kept in it. The kept reply is the target-only
configuration's (the reference), so that every configuration decodes exactly the same prompt
tokens at every turn; greedy speculative replies equal it up to llama.cpp's arithmetic drift.

Each turn runs every configuration, interleaved (the order rotates from turn to turn), on the
bench's engines (``Bench.run_once``: both caches emptied, each run pays its own prompt). Speed is
generation speed, prompt excluded: per turn, and over the whole conversation (all new tokens /
all generation time); the ratio is the whole conversation's against target-only.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from chatapp.assembly.loader import load_backend
from chatapp.backends.base import Backend
from chatapp.bench.runner import Bench, BenchBackends, progress_printer, rotated
from chatapp.bench.specs import TARGET, BenchPrompt, RunSpec
from chatapp.chat.message import ChatMessage
from chatapp.settings.config import Config

CONVERSATION_PATH = Path(__file__).resolve().parent.parent / "data" / "bench_conversation.json"


@dataclass(frozen=True)
class ScriptedConversation:
    id: str
    turns: tuple[str, ...]


@dataclass(frozen=True)
class TurnRow:
    """One turn of the conversation through one configuration."""

    config: str
    turn: int  # 1-based
    prompt_tokens: int
    tokens: int
    generation_s: float  # the turn's time minus its prompt time

    @property
    def tokens_per_s(self) -> float:
        return self.tokens / self.generation_s if self.generation_s > 0 else 0.0


@dataclass
class ConversationResult:
    """Every turn row, and the chat as the reference saw it: ``prompts[i]`` is turn i+1's prompt
    tokens, ``replies[i]`` the reply kept after it."""

    rows: list[TurnRow]
    prompts: list[list[int]]
    replies: list[str]

    def speed(self, config: str) -> float:
        """Whole-conversation generation speed of ``config``: all its tokens / all its time."""
        mine = [row for row in self.rows if row.config == config]
        seconds = sum(row.generation_s for row in mine)
        return sum(row.tokens for row in mine) / seconds if seconds > 0 else 0.0

    def ratio(self, config: str) -> float:
        reference = self.speed(TARGET)
        return self.speed(config) / reference if reference > 0 else 0.0


def load_conversation(path: Path = CONVERSATION_PATH) -> ScriptedConversation:
    data = json.loads(path.read_text(encoding="utf-8"))
    return ScriptedConversation(data["id"], tuple(data["turns"]))


def reply_text(backend: Backend, tokens: Sequence[int]) -> str:
    return b"".join(backend.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")


def run_conversation(bench: Bench, conversation: ScriptedConversation,
                     log: TextIO) -> ConversationResult:
    """Run ``conversation`` as one chat through every configuration of ``bench``, turn by turn;
    the bench's specs must include target-only (its replies are the ones kept)."""
    target = bench.backends.target
    messages = ([ChatMessage("system", bench.config.system_prompt)]
                if bench.config.system_prompt else [])
    result = ConversationResult([], [], [])
    for turn, text in enumerate(conversation.turns, 1):
        messages.append(ChatMessage("user", text))
        prompt = target.chat_prompt(messages)
        result.prompts.append(prompt)
        reference: list[int] = []
        for spec in rotated(bench.specs, turn - 1):
            run = bench.run_once(spec, messages, seed=turn)
            stats = run.stats
            row = TurnRow(spec.name, turn, len(prompt), stats.tokens,
                          stats.total_s - stats.prompt_s)
            result.rows.append(row)
            print(f"[turn {turn}/{len(conversation.turns)}] {spec.name:<18} {row.tokens:4d} "
                  f"tokens {row.tokens_per_s:6.1f} tok/s (prompt {len(prompt)} tokens)",
                  file=log, flush=True)
            if spec.drafter is None:
                reference = run.output
        reply = reply_text(target, reference)
        result.replies.append(reply)
        messages.append(ChatMessage("assistant", reply))
    return result


def conversation_command(config: Config, specs: Sequence[RunSpec], max_tokens: int,
                         json_path: Path | None, *, backends: BenchBackends | None = None,
                         warmup: bool = True, out: TextIO | None = None,
                         log: TextIO | None = None,
                         conversation: ScriptedConversation | None = None) -> int:
    """Run the conversation (default: ``load_conversation()``) through ``specs`` (target-only
    added when missing), print the per-turn and whole-conversation table to ``out``, write the
    rows and the chat to ``json_path``. ``backends`` given are the caller's (not closed)."""
    out, log = out or sys.stdout, log or sys.stderr
    conversation = conversation or load_conversation()
    specs = list(specs)
    if RunSpec(None) not in specs:
        specs.insert(0, RunSpec(None))
    owned = backends is None
    if backends is None:
        backends = BenchBackends(load_backend(config.target, "target", config,
                                              progress_printer(log)))
    try:
        bench = Bench(config, backends, specs, max_tokens, log)
        if warmup:
            bench.warm_up(BenchPrompt(conversation.id, "conversation", conversation.turns[0]))
        result = run_conversation(bench, conversation, log)
    finally:
        if owned:
            for backend in (backends.target, backends.draft):
                if backend is not None:
                    backend.close()
    print_conversation(out, conversation, [s.name for s in specs], result, max_tokens)
    if json_path is not None:
        data = {"conversation": dataclasses.asdict(conversation), "max_tokens": max_tokens,
                "rows": [dataclasses.asdict(row) for row in result.rows],
                "replies": result.replies,
                "summary": {name: {"tokens_per_s": result.speed(name),
                                   "ratio": result.ratio(name)} for name in
                            [s.name for s in specs]}}
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        print(f"Wrote {json_path}", file=out)
    return 0


def print_conversation(out: TextIO, conversation: ScriptedConversation, configs: Sequence[str],
                       result: ConversationResult, max_tokens: int) -> None:
    """A markdown table: per-turn and whole-conversation tokens/s, and x target-only."""
    turns = range(1, len(conversation.turns) + 1)
    print(f"specchat bench --conversation {conversation.id}: {len(conversation.turns)} turns "
          f"as one chat, up to {max_tokens} new tokens a turn; generation tokens/s, prompt "
          "excluded.", file=out)
    by_key = {(row.config, row.turn): row for row in result.rows}
    lengths = " / ".join(str(by_key[(TARGET, t)].prompt_tokens) for t in turns
                         if (TARGET, t) in by_key)
    print(f"Prompt tokens per turn: {lengths}", file=out)
    print("| configuration | " + " | ".join(f"turn {t}" for t in turns)
          + " | conversation | x target |", file=out)
    print("|---" * (len(conversation.turns) + 3) + "|", file=out)
    for name in configs:
        cells = [f"{by_key[(name, t)].tokens_per_s:.1f}" if (name, t) in by_key else "-"
                 for t in turns]
        print(f"| {name} | " + " | ".join(cells)
              + f" | {result.speed(name):.1f} | {result.ratio(name):.2f} |", file=out)
