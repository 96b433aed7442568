"""`specchat bench --fidelity CANDIDATE`: how close a weight layout (or an arithmetic path) keeps
the target to a reference, measured on the bench prompts.

Each side is a target file and whether llama.cpp may use AMX: ``shipped``, a catalog layout of
the target (``q8_0``, ``q4_0``) or a GGUF path, optionally suffixed ``/noamx`` (AMX kept off, as
in a build without it). The reference side answers every prompt greedily (``max_tokens`` tokens,
single-token decoding, as a chat would), then both sides evaluate the same sequences (prompt and
that reply) in one batch each, with logits at every position. Compared at every position but
the first of each sequence (the prediction from ``<|im_start|>`` alone, which no chat ever samples
from: its distribution is degenerate and its KL alone outweighs a prompt's):

- KL(reference || candidate) of the next-token distributions, in nats (the mean per token);
- whether both pick the same most likely token (top-1 agreement), over all positions and over
  the reply's positions;
- whether the candidate's greedy reply would be the reference's: every reply position agrees
  (per prompt); where one does not, the reference's logit margin between its own choice and the
  candidate's there (a near-tie when small);
- the largest absolute difference of a logit.

Each side runs in a child process of its own (``python -m chatapp.bench.fidelity``), since
keeping AMX off is irreversible for a process, and writes its logits to a temporary file the
parent reads prompt by prompt.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

import numpy as np

from chatapp.backends.context_size import MIN_AUTO_CONTEXT
from chatapp.bench.specs import BenchPrompt
from chatapp.errors import UserFacingError
from chatapp.settings.config import Config

NO_AMX = "/noamx"
DEFAULT_REPLY_TOKENS = 64


@dataclass(frozen=True)
class Side:
    """A target file and whether AMX is kept off while it runs; ``label`` as the user gave it."""

    label: str
    path: Path
    amx_off: bool


@dataclass
class FidelityReport:
    """What ``compare`` found, summed over the prompts."""

    positions: int = 0
    reply_positions: int = 0
    kl_sum: float = 0.0
    reply_kl_sum: float = 0.0
    agree: int = 0
    reply_agree: int = 0
    identical_replies: int = 0
    prompts: int = 0
    max_logit_diff: float = 0.0
    divergence_margins: list[float] = field(default_factory=list)

    @property
    def mean_kl(self) -> float:
        return self.kl_sum / max(self.positions, 1)

    @property
    def top1_agreement(self) -> float:
        return self.agree / max(self.positions, 1)

    @property
    def reply_top1_agreement(self) -> float:
        return self.reply_agree / max(self.reply_positions, 1)

    def to_json(self) -> dict[str, float | int | list[float]]:
        return {"positions": self.positions, "reply_positions": self.reply_positions,
                "mean_kl_nats": self.mean_kl, "reply_mean_kl_nats":
                self.reply_kl_sum / max(self.reply_positions, 1),
                "top1_agreement": self.top1_agreement,
                "reply_top1_agreement": self.reply_top1_agreement,
                "identical_greedy_replies": self.identical_replies, "prompts": self.prompts,
                "max_abs_logit_diff": self.max_logit_diff,
                "divergence_margins": self.divergence_margins}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    """Row-wise log-softmax in float64."""
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def add_sequence(report: FidelityReport, reference: np.ndarray, candidate: np.ndarray,
                 tokens: Sequence[int], prompt_len: int) -> None:
    """Add one sequence's comparison: ``reference`` and ``candidate`` are the logits at every
    position of ``tokens`` (row i predicts token i + 1); the reply starts at ``prompt_len``."""
    ref_log, cand_log = log_softmax(reference), log_softmax(candidate)
    kl = (np.exp(ref_log) * (ref_log - cand_log)).sum(axis=-1)
    ref_top, cand_top = reference.argmax(axis=-1), candidate.argmax(axis=-1)
    same = ref_top == cand_top
    reply = slice(prompt_len - 1, len(tokens) - 1)  # rows predicting the reply's tokens
    report.positions += len(kl) - 1  # row 0 (see the module notes) is left out
    report.kl_sum += float(kl[1:].sum())
    report.agree += int(same[1:].sum())
    report.reply_positions += len(kl[reply])
    report.reply_kl_sum += float(kl[reply].sum())
    report.reply_agree += int(same[reply].sum())
    report.max_logit_diff = max(report.max_logit_diff,
                                float(np.abs(reference[1:] - candidate[1:]).max()))
    report.prompts += 1
    followed = cand_top[reply] == np.asarray(tokens[prompt_len:], dtype=cand_top.dtype)
    if followed.all():
        report.identical_replies += 1
    else:
        row = prompt_len - 1 + int(np.argmin(followed))
        wanted, chosen = tokens[row + 1], int(cand_top[row])
        report.divergence_margins.append(float(reference[row, wanted] - reference[row, chosen]))


# -- the child: one side's logits ---------------------------------------------------------------

def greedy_reply(backend: object, prompt: list[int], max_tokens: int) -> list[int]:
    """The backend's greedy reply to ``prompt``, token by token (as a chat decodes)."""
    logits = backend.evaluate(prompt, 1)  # type: ignore[attr-defined]
    reply: list[int] = []
    while len(reply) < max_tokens:
        token = int(logits[-1].argmax())
        if token in backend.stop_ids:  # type: ignore[attr-defined]
            break
        reply.append(token)
        logits = backend.evaluate([token], 1)  # type: ignore[attr-defined]
    return reply


def side_main(argv: Sequence[str]) -> None:
    """Child process: with ``--generate N`` answer each prompt of ``--prompts`` greedily and write
    the sequences; else read them; then write every sequence's logits to ``--out``."""
    parser = argparse.ArgumentParser()
    parser.add_argument("model", type=Path)
    parser.add_argument("--sequences", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--prompts", type=Path)
    parser.add_argument("--generate", type=int, default=0)
    parser.add_argument("--n-ctx", type=int, default=4096)
    args = parser.parse_args(argv)
    from chatapp.backends.llama_cpp import LlamaCppBackend
    from chatapp.chat.message import ChatMessage

    backend = LlamaCppBackend(args.model, n_ctx=args.n_ctx)
    if args.generate:
        texts = json.loads(args.prompts.read_text(encoding="utf-8"))
        sequences = []
        for text in texts:
            prompt = backend.chat_prompt([ChatMessage("user", text)])
            backend.truncate(0)
            sequences.append({"tokens": prompt + greedy_reply(backend, prompt, args.generate),
                              "prompt_len": len(prompt)})
        args.sequences.write_text(json.dumps(sequences), encoding="utf-8")
    sequences = json.loads(args.sequences.read_text(encoding="utf-8"))
    rows = sum(len(s["tokens"]) for s in sequences)
    out = np.lib.format.open_memmap(args.out, mode="w+", dtype=np.float32,
                                    shape=(rows, backend.vocab_size))
    row = 0
    for sequence in sequences:
        backend.truncate(0)
        tokens = sequence["tokens"]
        out[row:row + len(tokens)] = backend.evaluate(tokens, len(tokens))
        row += len(tokens)
    out.flush()
    print(json.dumps({"name": backend.name}), flush=True)


# -- the parent ----------------------------------------------------------------------------------

def run_side(side: Side, folder: Path, sequences: Path, prompts: Path | None,
             generate: int, n_ctx: int) -> tuple[Path, str]:
    """Run one side in a child process; its logits file and the model's name."""
    out = folder / f"{'ref' if generate else 'cand'}.npy"
    command = [sys.executable, "-m", "chatapp.bench.fidelity", str(side.path), "--sequences",
               str(sequences), "--out", str(out), "--n-ctx", str(n_ctx)]
    if generate:
        command += ["--prompts", str(prompts), "--generate", str(generate)]
    env = dict(os.environ)
    if side.amx_off:
        env["SPECCHAT_AMX"] = "off"
    result = subprocess.run(command, capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(f"the {side.label} side failed: {result.stderr.strip()[-600:]}")
    return out, json.loads(result.stdout.strip().splitlines()[-1])["name"]


def measure_fidelity(reference: Side, candidate: Side, texts: Sequence[str], reply_tokens: int,
                     n_ctx: int = 4096, log: TextIO | None = None) -> FidelityReport:
    """Compare ``candidate`` with ``reference`` on ``texts`` (user messages)."""
    log = log or sys.stderr
    with tempfile.TemporaryDirectory(prefix="specchat-fidelity-") as tmp:
        folder = Path(tmp)
        prompts, sequences = folder / "prompts.json", folder / "sequences.json"
        prompts.write_text(json.dumps(list(texts)), encoding="utf-8")
        print(f"Reference {reference.label}: greedy replies and logits ...", file=log, flush=True)
        ref_path, _ = run_side(reference, folder, sequences, prompts, reply_tokens, n_ctx)
        print(f"Candidate {candidate.label}: logits ...", file=log, flush=True)
        cand_path, _ = run_side(candidate, folder, sequences, None, 0, n_ctx)
        ref_logits = np.load(ref_path, mmap_mode="r")
        cand_logits = np.load(cand_path, mmap_mode="r")
        report, row = FidelityReport(), 0
        for sequence in json.loads(sequences.read_text(encoding="utf-8")):
            tokens = sequence["tokens"]
            end = row + len(tokens)
            add_sequence(report, np.asarray(ref_logits[row:end - 1]),
                         np.asarray(cand_logits[row:end - 1]), tokens, sequence["prompt_len"])
            row = end
        del ref_logits, cand_logits
    return report


def print_fidelity(out: TextIO, reference: Side, candidate: Side, report: FidelityReport) -> None:
    margins = sorted(report.divergence_margins)
    shown = ", ".join(f"{m:.3f}" for m in margins[:8]) + (" ..." if len(margins) > 8 else "")
    out.write(
        f"Fidelity of {candidate.label} to {reference.label} over {report.prompts} prompts "
        f"({report.positions} positions, {report.reply_positions} in the reference's greedy "
        f"replies):\n"
        f"  mean KL(reference || candidate): {report.mean_kl:.5f} nats/token "
        f"(replies: {report.reply_kl_sum / max(report.reply_positions, 1):.5f})\n"
        f"  same most likely token: {report.top1_agreement:.2%} of positions "
        f"(replies: {report.reply_top1_agreement:.2%})\n"
        f"  greedy replies identical: {report.identical_replies}/{report.prompts}"
        + (f"; where one parts, the reference's logit margin: {shown}" if margins else "")
        + f"\n  largest |logit difference|: {report.max_logit_diff:.4f}\n")
    if math.isnan(report.mean_kl):
        out.write("  (NaN: a side produced non-finite logits)\n")


def resolve_side(label: str, target: str, progress: Callable[[int, int], None] | None = None
                 ) -> Side:
    """The side ``label`` names for the target ``target`` (an alias or a path): ``shipped``, a
    layout of the catalog target, or a GGUF path; ``/noamx`` at the end keeps AMX off."""
    from chatapp.backends.catalog import CATALOG, resolve_model
    from chatapp.backends.layouts import prepare_layout

    name, amx_off = label.removesuffix(NO_AMX), label.endswith(NO_AMX)
    if name == "shipped":
        return Side(label, resolve_model(target), amx_off)
    spec = CATALOG.get(target)
    layouts = {layout.name: layout for cpu in (spec.as_target.amx, spec.as_target.no_amx)
               for layout in (cpu.auto, cpu.fast) if layout} if spec and spec.as_target else {}
    if name in layouts:
        return Side(label, prepare_layout(resolve_model(target), layouts[name], progress), amx_off)
    path = Path(name).expanduser()
    if path.is_file():
        return Side(label, path, amx_off)
    known = ", ".join(["shipped", *layouts])
    raise UserFacingError(f"No target layout or file '{name}': give one of {known} or the path "
                          f"of a GGUF file, optionally followed by {NO_AMX}.")


def fidelity_command(config: Config, candidate: str, reference: str,
                     prompts: Sequence[BenchPrompt], reply_tokens: int,
                     json_path: Path | None = None, out: TextIO | None = None) -> int:
    """Resolve both sides, measure, print (and write ``json_path``)."""
    out = out or sys.stdout
    sides = [resolve_side(label, config.target) for label in (reference, candidate)]
    report = measure_fidelity(sides[0], sides[1], [p.text for p in prompts], reply_tokens,
                              config.context_tokens or MIN_AUTO_CONTEXT)
    print_fidelity(out, sides[0], sides[1], report)
    if json_path is not None:
        data = {"reference": reference, "candidate": candidate, "reply_tokens": reply_tokens,
                "prompts": [p.id for p in prompts], **report.to_json()}
        json_path.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    side_main(sys.argv[1:])
