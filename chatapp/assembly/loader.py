"""Build a ready ``ChatSession`` from a ``Config``: resolve models, load backends, pick the drafter.

Backends are imported lazily, so the llama.cpp path never imports torch. Progress is reported as
(message, fraction or None) through the callback, for the CLI's stderr line and the TUI's loader.
With ``config.rpc`` the target is a ``RemoteTarget`` (its layers on those servers, in a worker
process); the draft is loaded here as always, in a process that never registers an RPC server,
so it cannot land on one.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from pathlib import Path

from chatapp.assembly.layout_costs import layout_costs, measure_layouts, needs_measuring
from chatapp.assembly.local_models import choose_draft, resolve_name
from chatapp.backends.base import Backend
from chatapp.backends.catalog import CATALOG
from chatapp.backends.layouts import LayoutPlan, LayoutSetting, plan_layout, prepare_layout
from chatapp.backends.memory_estimate import check_fits
from chatapp.chat.attachments import message_text
from chatapp.chat.history import HistoryError, HistoryStore, StoredMessage
from chatapp.chat.message import ChatMessage
from chatapp.chat.reply_settings import generation_settings, policy_setting
from chatapp.chat.session import ChatSession
from chatapp.drafters.combined import NgramModelDrafter
from chatapp.drafters.edits import line_end_test
from chatapp.drafters.lookup import NgramDrafter
from chatapp.drafters.model import ModelDrafter
from chatapp.drafters.suffix import SuffixSource
from chatapp.drafters.suffix_index import HistoryCorpus
from chatapp.engine import calibration
from chatapp.engine.contracts import Drafter, DraftPolicy
from chatapp.engine.loop import SpeculativeEngine, check_compatible
from chatapp.policy.auto import AutoDraftLength
from chatapp.policy.measurements import memory_path, recall_calibration, remember_calibration
from chatapp.settings.config import Config

LoadProgress = Callable[[str, float | None], None]


def _quiet(message: str, fraction: float | None) -> None:
    """The default progress callback: report nothing."""


def load_backend(model: str, role: str, config: Config, progress: LoadProgress = _quiet,
                 n_ctx: int | None = None) -> Backend:
    """Resolve ``model`` (alias, path or store name), assembling it if needed, and load it on
    the backend of its ``role`` ("target": ``config.backend``; "draft":
    ``config.draft_backend_name``) with a window of ``n_ctx`` tokens (None: ``config.n_ctx``,
    where "auto" lets the backend choose from the model and the memory)."""
    n_ctx = n_ctx or config.context_tokens

    def assembling(done: int, total: int) -> None:
        progress(f"Preparing {role} model {model}", done / total if total else None)

    backend = config.draft_backend_name if role == "draft" else config.backend
    path = resolve_name(model, config, assembling)
    if role == "target" and config.rpc:
        return _load_remote_target(path, model, config, progress, n_ctx)
    if backend == "llama":
        path = runnable_layout(model, role, path, config, progress)
    if not config.device.startswith("cuda"):
        check_fits([path], backend, config.dtype if config.dtype != "auto" else "float32")
    progress(f"Loading {role} model {model}", None)
    if backend == "hf":
        from chatapp.backends.transformers_backend import TransformersBackend

        return TransformersBackend(path, device=config.device, dtype=config.dtype,
                                   n_ctx=n_ctx, threads=config.threads)
    from chatapp.backends.llama_cpp import LlamaCppBackend

    return LlamaCppBackend(path, n_ctx=n_ctx, threads=config.threads,
                           gpu_layers=config.gpu_layers)


def layout_plan(model: str, role: str, config: Config) -> LayoutPlan:
    """The weight layout ``model`` (an alias or a path) runs in as ``role`` on llama.cpp here,
    with what was measured of its layouts on this machine (``chatapp.assembly.layout_costs``)."""
    from chatapp.backends.llama_runtime import amx_in_use

    spec = CATALOG.get(model)
    return plan_layout(spec.layouts(role) if spec else None, LayoutSetting(config.layout),
                       amx_in_use(), layout_costs(model, role, config))


def runnable_layout(model: str, role: str, path: Path, config: Config,
                    progress: LoadProgress = _quiet) -> Path:
    """The file of ``layout_plan``'s layout, prepared from ``path`` (the shipped file) once;
    for ``layout = "fast"`` the layouts are measured here first, once."""
    if needs_measuring(config, role):
        measure_layouts(model, role, path, config, progress)
    plan = layout_plan(model, role, config)
    if plan.layout is None:
        return path
    name = plan.layout.name

    def preparing(done: int, total: int) -> None:
        progress(f"Preparing the {name} layout of the {role} model (once)",
                 done / total if total else None)

    return prepare_layout(path, plan.layout, preparing)


def _load_remote_target(path: Path, model: str, config: Config, progress: LoadProgress,
                        n_ctx: int | None) -> Backend:
    """The target on ``config.rpc``'s servers (probed first), with ``config.tensor_split``."""
    from chatapp.backends.endpoints import parse_endpoints
    from chatapp.backends.remote_target import RemoteTarget

    progress(f"Loading target model {model} on {', '.join(config.rpc)}", None)
    return RemoteTarget(path, parse_endpoints(config.rpc), n_ctx=n_ctx,
                        threads=config.threads, tensor_split=config.tensor_split)


def load_history_index(store: HistoryStore, target: Backend, config: Config) -> SuffixSource:
    """The suffix source over ``store``'s chats, each rendered as ``target`` sees it (its chat
    template, ``config``'s system prompt first), newest chats first up to the capacity."""
    system = [ChatMessage("system", config.system_prompt)] if config.system_prompt else []

    def render(messages: list[StoredMessage]) -> list[int]:
        return target.chat_prompt(
            system + [ChatMessage(m.role, message_text(m.content, m.attachments))
                      for m in messages])

    return SuffixSource(HistoryCorpus.from_store(store, render))


def make_drafter(config: Config, target: Backend, progress: LoadProgress = _quiet,
                 draft: Backend | None = None, edits: bool = True,
                 history_index: SuffixSource | None = None) -> Drafter:
    """The drafter ``config.drafter`` asks for: "model" (the draft model), "ngram" (speculative
    edits, the history-wide suffix index and prompt lookup, no draft model loaded) or
    "ngram+model". The draft model (``draft`` if given, else loaded) is checked against the
    target's vocabulary, and only evaluates anything once it is asked to draft
    (a deferred ``ModelDrafter``). ``edits=False`` leaves the speculative edits out (for
    comparisons). ``history_index``: the suffix source over the history (``load_history_index``);
    without it the suffix index covers the open conversation only."""
    if config.drafter in ("ngram", "ngram+model"):
        suffix = history_index if history_index is not None else SuffixSource(HistoryCorpus())
        ngram = NgramDrafter(target.vocab_size, edits=edits, suffix=suffix,
                             ends_line=line_end_test(target.token_bytes))
    if config.drafter == "ngram":
        return ngram
    if draft is None:
        draft = load_draft(config, target, progress)
    else:
        check_compatible(draft, target)
    model = ModelDrafter(draft, deferred=True)
    if config.drafter == "ngram+model":
        return NgramModelDrafter(ngram, model)
    return model


def make_policy(config: Config, costs: calibration.Calibration | None = None) -> DraftPolicy:
    """A fresh policy as ``config`` says: a fixed K, or for draft_length "auto" an
    ``AutoDraftLength`` (``PolicySetting.policy``), calibrated with ``costs`` if given."""
    return policy_setting(config).policy(costs)


def load_draft(config: Config, target: Backend, progress: LoadProgress = _quiet
               ) -> Backend | None:
    """The draft model of ``config.drafter`` (None for "ngram"), checked against the target's
    vocabulary, with the target's window (its cache holds the same context)."""
    if config.drafter == "ngram":
        return None
    draft = load_backend(config.draft, "draft", config, progress, target.n_ctx)
    try:
        check_compatible(draft, target)
    except Exception:
        draft.close()
        raise
    return draft


# What the calibration evaluates after: a chat prompt of about 200 tokens, as a reply's steps do.
CALIBRATION_TEXT = (
    "Add type hints to this function and keep its behaviour:\n\n"
    "def merge(intervals):\n"
    "    intervals = sorted(intervals, key=lambda pair: pair[0])\n"
    "    merged = []\n"
    "    for start, end in intervals:\n"
    "        if merged and start <= merged[-1][1]:\n"
    "            merged[-1][1] = max(merged[-1][1], end)\n"
    "        else:\n"
    "            merged.append([start, end])\n"
    "    return merged\n")


def ensure_calibration(config: Config, target: Backend, draft: Backend | None,
                       progress: LoadProgress = _quiet) -> calibration.Calibration:
    """This machine's costs for ``config``'s setup (``chatapp.engine.calibration``): the kept
    ones, else measured now (a few seconds, once per machine, pair, layout and thread setting)
    and kept for every later start (``chatapp.policy.measurements``)."""
    path = memory_path(config.measured_setup())
    kept = recall_calibration(path)
    if kept is not None:
        return kept
    progress("Measuring what drafting costs on this CPU (once)", None)
    measured = measure_calibration(target, draft)
    remember_calibration(measured, path)
    return measured


def measure_calibration(target: Backend, draft: Backend | None = None) -> calibration.Calibration:
    """This machine's costs measured now, as every start that has none kept measures them: after
    the chat prompt of ``CALIBRATION_TEXT``, for every batch size a draft can need."""
    context = target.chat_prompt([ChatMessage("user", CALIBRATION_TEXT)])
    return calibration.measure(target, context, AutoDraftLength().free_max_k + 1, draft)


def build_session(config: Config, progress: LoadProgress = _quiet, with_draft: bool = True,
                  history: HistoryStore | None = None) -> ChatSession:
    """Load the target (and the drafter, if ``with_draft``) and return a session ready to chat.
    With ``history`` the default drafter's suffix index covers its chats
    (``load_history_index``); each reply's hints say which of them it continues and which were
    deleted (``DraftHints``). An ``auto`` draft is chosen first (``choose_draft``); the session's
    notes say which."""
    config, draft_note = choose_draft(config) if with_draft else (config, None)
    target = load_backend(config.target, "target", config, progress)
    free_sources = with_draft and config.drafter in ("ngram", "ngram+model")
    try:
        index = load_history_index(history, target, config) if (
            free_sources and history is not None) else None
        draft = load_draft(config, target, progress) if with_draft else None
        try:
            drafter = make_drafter(config, target, progress, draft, history_index=index) if (
                with_draft) else None
            if drafter is not None and config.fixed_draft_length is None:
                ensure_calibration(config, target, draft, progress)
        except Exception:
            if draft is not None:
                draft.close()
            raise
    except Exception:
        target.close()
        raise
    seed = config.seed if config.seed is not None else random.SystemRandom().randrange(2**32)
    return ChatSession(SpeculativeEngine(target, drafter), generation_settings(config), seed,
                       config.system_prompt,
                       (*runtime_notes(config), *([draft_note] if draft_note else [])),
                       takes_prediction=free_sources)


def build_session_over_history(config: Config, progress: LoadProgress = _quiet,
                               history_path: Path | None = None) -> ChatSession:
    """``build_session`` with the default drafter's index over the chats saved at
    ``history_path`` (None: the default place), read through a connection of the calling
    thread's own (SQLite connections stay on their thread: this runs in a loading thread);
    without that index when the history cannot be read."""
    try:
        store = HistoryStore(history_path)
    except HistoryError:
        return build_session(config, progress)
    try:
        return build_session(config, progress, history=store)
    finally:
        store.close()


def runtime_notes(config: Config) -> tuple[str, ...]:
    """What the loaded backends ask to tell the user once (e.g. the AMX guard)."""
    if "llama" not in (config.backend, config.draft_backend_name):
        return ()
    from chatapp.backends.llama_runtime import runtime_notes as llama_notes

    return tuple(llama_notes())
