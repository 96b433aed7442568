"""Where an ``auto`` reply loses or gains against plain decoding, per source of drafts.

Each round decodes every prompt plain (K = 0) and with a calibrated ``auto`` policy, in
alternating order, through the session's one reply path; with ``--versus FIELD=VALUE`` also with
a policy whose ``Tuning`` differs in that field, side by side in the same rounds. The policies are
fresh for every reply, or with ``--learnt`` each kept across all replies of the run (as the app
keeps one). A drafting step's loss is its time less what plain decoding of the tokens it emitted
would have taken, at the median one-token step of the *same* reply: the yardstick moves with the
machine's load, so a loss of 1-2% of a reply shows where whole-reply ratios (noisy by 10% or more
on a busy 2-core machine) cannot. Prints per reply the whole-reply ratio and each source's steps,
drafted and accepted tokens and loss in ms; then, per policy over all rounds, each source's loss
as a share of its replies' time.

    python -m benchmarks.source_losses [--prompts qa,prose] [--rounds 3] [--max-tokens 128]
        [--learnt] [--versus free_turn_memory=0]

Run it with a state directory of its own (``XDG_STATE_HOME=$(mktemp -d)``) so that no learnt
memory is used; the calibration is measured once there.
"""

from __future__ import annotations

import argparse
import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import fields, replace

from chatapp.assembly.loader import build_session
from chatapp.bench.specs import load_prompts, select_prompts
from chatapp.chat.message import ChatMessage
from chatapp.chat.session import ChatSession
from chatapp.engine.calibration import Calibration
from chatapp.engine.contracts import DraftPolicy
from chatapp.engine.events import StepEvent
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.fixed import FixedDraftLength
from chatapp.policy.measurements import memory_path, recall_calibration
from chatapp.policy.tuning import Tuning
from chatapp.settings.config import load_config

Losses = dict[str, list[float]]  # per source: steps, drafted, accepted, seconds lost


def steps_of(session: ChatSession, text: str, policy: DraftPolicy) -> list[StepEvent]:
    """The step events of one reply to ``text``."""
    _, events = session.reply([ChatMessage("user", text)], policy)
    return [event for event in events if isinstance(event, StepEvent)]


def seconds(steps: Sequence[StepEvent]) -> float:
    return sum(step.verify_s + step.draft_s for step in steps)


def losses(steps: Sequence[StepEvent]) -> Losses:
    """Per source, over the drafting steps: count, drafted, accepted, and the seconds lost
    against plain decoding of what each emitted, at this reply's median one-token step."""
    plain = statistics.median([s.verify_s for s in steps if not s.drafted] or [0.0])
    by_source: Losses = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    for step in steps:
        if step.drafted:
            tally = by_source[step.source]
            tally[0] += 1
            tally[1] += step.drafted
            tally[2] += step.accepted
            tally[3] += step.verify_s + step.draft_s - (step.accepted + 1) * plain
    return by_source


def tuning_change(text: str) -> Tuning:
    """``Tuning()`` with one field set from ``FIELD=VALUE``."""
    name, _, value = text.partition("=")
    kinds = {field.name: type(getattr(Tuning(), field.name)) for field in fields(Tuning)}
    if name not in kinds:
        raise SystemExit(f"--versus: no Tuning field {name!r}; known: {', '.join(kinds)}")
    return replace(Tuning(), **{name: kinds[name](value)})


def auto(tuning: Tuning, costs: Calibration | None) -> AutoDraftLength:
    policy = AutoDraftLength(tuning)
    if costs is not None:
        policy.calibrate(costs)
    return policy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="qa,prose", help="bench prompt ids or categories")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--learnt", action="store_true",
                        help="keep each policy across the run's replies")
    parser.add_argument("--versus", metavar="FIELD=VALUE",
                        help="also a policy with this Tuning field changed")
    args = parser.parse_args()
    tunings = {"auto": Tuning()}
    if args.versus:
        tunings[args.versus] = tuning_change(args.versus)
    config = load_config()
    session = build_session(config)
    session.configure(replace(session.settings, max_tokens=args.max_tokens),
                      session.system_prompt)
    costs = recall_calibration(memory_path(config.measured_setup()))
    kept = {label: auto(tuning, costs) for label, tuning in tunings.items()}
    prompts = select_prompts(load_prompts(), args.prompts)
    labels = ["plain", *tunings]
    total: dict[str, Losses] = {label: defaultdict(lambda: [0.0] * 4) for label in tunings}
    spent = dict.fromkeys(tunings, 0.0)
    for round_ in range(args.rounds):
        for prompt in prompts:
            runs = {}
            for label in labels if round_ % 2 == 0 else labels[::-1]:
                policy: DraftPolicy = (
                    FixedDraftLength(0) if label == "plain" else
                    kept[label] if args.learnt else auto(tunings[label], costs))
                runs[label] = steps_of(session, prompt.text, policy)
            for label in tunings:
                spent[label] += seconds(runs[label])
                tallies = losses(runs[label])
                for source, tally in tallies.items():
                    total[label][source] = [a + b for a, b in zip(total[label][source], tally)]
                ratio = seconds(runs["plain"]) / seconds(runs[label])
                print(f"{prompt.id:14s} {label:10s} {ratio:.3f}  " + "  ".join(
                    f"{source} {t[0]:.0f}st {t[1]:.0f}d {t[2]:.0f}a {t[3] * 1e3:+.0f}ms"
                    for source, t in sorted(tallies.items())), flush=True)
    for label in tunings:
        print(f"\n{label}: loss share of its replies' time, per source (negative: gained)")
        for source, tally in sorted(total[label].items(), key=lambda item: -item[1][3]):
            print(f"  {source:18s} {tally[3] / spent[label]:+7.2%}  ({tally[0]:.0f} steps, "
                  f"{tally[1]:.0f} drafted, {tally[2]:.0f} accepted)")
        print(f"  {'all':18s} {sum(t[3] for t in total[label].values()) / spent[label]:+7.2%}")


if __name__ == "__main__":
    main()
