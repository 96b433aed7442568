"""Replay the model-free drafter over the target's greedy replies of a bench run: tokens per
target call at a fixed K, deterministic, no model evaluated (a busy machine cannot disturb it).

    python -m benchmarks.drafter_replay BENCH.json [--k 3,8,16] [--trace PROMPT_ID] [--history]
        [--costs MS,MS,...|calibrated]

``BENCH.json`` is ``specchat bench --json``'s file; its target-only rows carry the greedy reply.
Each prompt is re-tokenized with the target's chat template (the model file is opened, not run).
A ``specchat bench --conversation --json`` file is replayed turn by turn, each turn's prompt the
whole conversation before it, its reply the target-only reply re-tokenized; the last row is then
the whole conversation.
At every step the drafter proposes up to K tokens, the longest prefix that matches the reply is
accepted and the reply's next token follows, as greedy verification would do. ``--history``
puts the other prompts' chats in the suffix index first (the user's earlier chats). ``--trace``
prints each step of one prompt: the source, what it proposed, what the target wrote. ``--costs``
(this machine's verification costs) prints instead the speedup over plain decoding that a perfect
choice of every step's draft length would reach with these proposals.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from chatapp.assembly.loader import load_backend
from chatapp.backends.base import Backend
from chatapp.bench import load_prompts
from chatapp.chat.message import ChatMessage
from chatapp.drafters.edits import line_end_test
from chatapp.drafters.lookup import NgramDrafter
from chatapp.drafters.suffix import SuffixSource
from chatapp.drafters.suffix_index import HistoryCorpus
from chatapp.engine.calibration import Calibration
from chatapp.engine.contracts import NO_HINTS, DraftBudget, Proposal, StepOutcome
from chatapp.engine.sampling import SamplingParams
from chatapp.policy.auto import AutoDraftLength
from chatapp.settings.config import Config

RNG = np.random.default_rng(0)  # unused: the drafter is deterministic


def replay(drafter: NgramDrafter, prompt: Sequence[int], reply: Sequence[int], k: int,
           piece: Callable[[int], str] | None = None,
           costs: Sequence[float] | None = None) -> list[int]:
    """The tokens each target call emits to produce ``reply`` after ``prompt`` with ``drafter``
    proposing up to ``k`` tokens a step (greedy verification); with ``piece`` (a token's text),
    print every step. With ``costs`` (seconds to verify n = 1, 2, ... tokens; k < len(costs)),
    an oracle cuts each proposal where it pays best: to the n <= matched + 1 with the most tokens
    per second, the ceiling of any policy choosing K for this drafter."""
    context = list(prompt)
    drafter.prefill(context[:-1], NO_HINTS)
    at, steps = 0, []
    while at < len(reply):
        budget = DraftBudget.uniform(min(k, len(reply) - at - 1))
        drafted = drafter.propose(context, budget, SamplingParams(), RNG)
        proposal = drafted.tokens
        matched = 0
        while matched < len(proposal) and proposal[matched] == reply[at + matched]:
            matched += 1
        n = matched + 1
        if costs is not None:
            n = max(range(1, n + 1), key=lambda size: size / costs[size - 1])
        emitted = reply[at:at + n]
        if piece is not None:
            shown = "".join(piece(t) for t in proposal[:16])
            print(f"{at:4d} {drafted.source or '-':<18} accepted {matched:2d}/{len(proposal):2d} "
                  f"proposed {shown!r} wrote {''.join(piece(t) for t in emitted)!r}")
        context.extend(emitted)
        at += len(emitted)
        steps.append(len(emitted))
    return steps


def replay_auto(drafter: NgramDrafter, prompt: Sequence[int], reply: Sequence[int],
                policy: AutoDraftLength, costs: Sequence[float]) -> float:
    """Speedup over plain decoding of ``reply`` with ``policy`` choosing every step's draft as
    in the engine (its budget, the drafter's proposal within it, the cut), each step timed at
    ``costs`` (seconds to verify n = 1, 2, ... tokens), greedy verification against ``reply``."""
    context = list(prompt)
    drafter.prefill(context[:-1], NO_HINTS)
    policy.start_turn()
    at, seconds = 0, 0.0
    while at < len(reply):
        budget = policy.budget().capped(len(reply) - at - 1)
        drafted = Proposal.empty(0)
        if budget.asks_drafter:
            drafted = drafter.propose(context, budget, SamplingParams(), RNG)
            drafted = drafted.cut(budget.cut(drafted.source, len(drafted.tokens)))
        proposal = drafted.tokens
        matched = 0
        while matched < len(proposal) and proposal[matched] == reply[at + matched]:
            matched += 1
        step_s = costs[len(proposal)]
        context.extend(reply[at:at + matched + 1])
        policy.observe(StepOutcome(drafted.source, len(proposal), matched, 0.0, step_s,
                                   drafter.score_emitted(context)))
        at += matched + 1
        seconds += step_s
    return len(reply) * costs[0] / seconds


def ceiling_speedup(steps: Sequence[int], costs: Sequence[float]) -> float:
    """Plain decoding's time for the tokens of ``steps`` over theirs at ``costs``."""
    return sum(steps) * costs[0] / sum(costs[n - 1] for n in steps)


def conversation_chats(target: Backend, system: list[ChatMessage],
                       data: dict) -> dict[str, tuple[list[int], list[int]]]:
    """Per turn of a ``bench --conversation`` file: the prompt (the conversation so far through
    the chat template) and the target-only reply, re-tokenized."""
    messages, chats = list(system), {}
    for turn, (text, reply) in enumerate(zip(data["conversation"]["turns"], data["replies"]), 1):
        messages.append(ChatMessage("user", text))
        chats[f"turn {turn}"] = (target.chat_prompt(messages), target.tokenize(reply))
        messages.append(ChatMessage("assistant", reply))
    return chats


def _measure(steps: Sequence[int], costs: Sequence[float] | None) -> float:
    """The ceiling speedup of ``steps`` with ``costs``, else their tokens per target call."""
    return ceiling_speedup(steps, costs) if costs else sum(steps) / len(steps)


def costs_from_option(option: str, data: dict, parser: argparse.ArgumentParser) -> list[float]:
    """Seconds to verify n = 1, 2, ... tokens: ``option``'s milliseconds, or for "calibrated"
    the calibration of the bench JSON ``data`` (``meta.calibrations``, one adaptive
    configuration)."""
    if option != "calibrated":
        return [float(ms) / 1000 for ms in option.split(",")]
    calibrations = data.get("meta", {}).get("calibrations", {})
    if len(calibrations) != 1:
        parser.error(f"--costs calibrated needs one calibration in the JSON, found "
                     f"{len(calibrations)}")
    verify = Calibration.from_data(next(iter(calibrations.values()))).verify
    return [verify[n] for n in range(1, max(verify) + 1)]


def _piece(target: Backend) -> Callable[[int], str]:
    return lambda token: target.token_bytes(token).decode("utf-8", "replace")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bench_json", type=Path)
    parser.add_argument("--k", default="3,8,16", help="comma-separated draft lengths")
    parser.add_argument("--trace", help="print every step of this prompt (at the first K)")
    parser.add_argument("--history", action="store_true",
                        help="index the other prompts' chats first (earlier chats)")
    parser.add_argument("--prompt-file", type=Path, help="the bench's --prompt-file, if any")
    parser.add_argument("--auto", action="store_true", help="with --costs: also replay the auto "
                        "policy (calibrated with the costs, fresh per prompt) on the same steps")
    parser.add_argument("--costs", help="comma-separated ms to verify n = 1, 2, ... tokens "
                        "(`specchat bench --verify-costs`), or 'calibrated' for the costs the "
                        "bench run's adaptive configuration was calibrated with: print each K's "
                        "ceiling speedup instead (an oracle cuts every proposal where it pays "
                        "best)")
    args = parser.parse_args(argv)
    data = json.loads(args.bench_json.read_text())
    costs = costs_from_option(args.costs, data, parser) if args.costs else None
    conversation = "conversation" in data
    if conversation and args.history:
        parser.error("--history puts other chats in the index; a conversation's other turns "
                     "are in its own prompts already")
    config = dataclasses.replace(Config(), n_ctx=2048, threads=1)
    target = load_backend(config.target, "target", config)
    texts = {p.id: p.text for p in load_prompts(*([args.prompt_file] if args.prompt_file else []))}
    system = [ChatMessage("system", config.system_prompt)] if config.system_prompt else []
    if conversation:
        chats = conversation_chats(target, system, data)
    else:
        rows = [r for r in data["rows"] if r["config"] == "target" and r["prompt"] in texts]
        asked = {r["prompt"]: [*system, ChatMessage("user", texts[r["prompt"]])] for r in rows}
        chats = {r["prompt"]: (target.chat_prompt(asked[r["prompt"]]), r["output"]) for r in rows}
    ks = [int(k) for k in args.k.split(",")]
    if costs is not None and max(ks) >= len(costs):
        parser.error(f"--costs needs {max(ks) + 1} sizes for K = {max(ks)}")
    measure = "ceiling x plain" if costs else "tokens per call"
    auto = args.auto and costs is not None
    print(f"{'prompt':<20}" + "".join(f"{'K=' + str(k):>8}" for k in ks)
          + (f"{'auto':>8}" if auto else "") + f"  ({measure})")
    all_steps: list[list[int]] = [[] for _ in ks]
    for name, (prompt, reply) in chats.items():
        per_call = []
        for i, k in enumerate(ks):
            corpus = HistoryCorpus()
            if args.history:
                for other, (p, r) in chats.items():
                    if other != name:
                        corpus.add_chat_text(other, p + r)
            drafter = NgramDrafter(target.vocab_size, suffix=SuffixSource(corpus),
                                   ends_line=line_end_test(target.token_bytes))
            traced = args.trace == name and i == 0
            steps = replay(drafter, prompt, reply, k, _piece(target) if traced else None, costs)
            all_steps[i].extend(steps)
            per_call.append(_measure(steps, costs))
        if auto:
            policy = AutoDraftLength()
            policy.calibrate(Calibration(dict(enumerate(costs, 1))))
            drafter = NgramDrafter(target.vocab_size, suffix=SuffixSource(HistoryCorpus()),
                                   ends_line=line_end_test(target.token_bytes))
            per_call.append(replay_auto(drafter, prompt, reply, policy, costs))
        print(f"{name:<20}" + "".join(f"{v:8.2f}" for v in per_call))
    if conversation:
        print(f"{'conversation':<20}" + "".join(f"{_measure(s, costs):8.2f}" for s in all_steps))
    target.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
