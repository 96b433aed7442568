"""The models on this machine, by name: the catalog's and the other tools'
(``chatapp.model_stores``), and the draft ``auto`` picks for a target.

``resolve_name`` maps any model name a setting takes (a catalog alias, a path, ``ollama:``,
``lmstudio:``, ``hf:`` or ``llamacpp:`` names) to a file. ``choose_draft`` settles the draft
model: for ``draft = "auto"``, and for the default draft when the target is another tool's model,
the best local draft for the target (``chatapp.model_stores.pairing``), or no draft model at all
(the model-free drafters) with a one-line note saying why.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from chatapp.backends.catalog import (
    CATALOG,
    DEFAULT_DRAFT,
    ModelNotFoundError,
    ProgressCallback,
    assembled_path,
    is_ready,
    resolve_model,
)
from chatapp.model_stores.gguf_facts import UnreadableModelError, model_facts
from chatapp.model_stores.pairing import Surveyed, drafts_for, survey
from chatapp.model_stores.stores import Discovery, FoundModel, discover, is_store_name
from chatapp.settings.config import Config

AUTO_DRAFT = "auto"


def local_models(config: Config) -> Discovery:
    """The catalog's verified models (store "catalog", named by alias) and every model found in
    the other tools' stores and ``config.model_dirs``."""
    found = Discovery([FoundModel(spec.alias, assembled_path(spec), "catalog", spec.size)
                       for spec in CATALOG.values() if is_ready(spec)])
    found.add(discover(config.model_dirs))
    return found


def resolve_name(name: str, config: Config, progress: ProgressCallback | None = None) -> Path:
    """The file of the model ``name``: a store name's file (the first store's when two hold the
    name), else ``resolve_model``'s (a catalog alias, assembled if needed, or a path).
    ``ModelNotFoundError`` for a store name that nothing holds."""
    if not is_store_name(name):
        return resolve_model(name, progress)
    found = discover(config.model_dirs).named(name)
    if not found:
        raise ModelNotFoundError(f"No model '{name}' on this machine. `specchat models` lists the "
                                 "models found, with their names.")
    return found[0].path


def wants_auto_draft(config: Config) -> bool:
    """Whether the draft model is ``auto``'s to choose: asked for, or the default draft while the
    target is another tool's model (the catalog's draft would rarely share its vocabulary)."""
    if config.drafter == "ngram" or config.draft_length == "0":
        return False
    return config.draft == AUTO_DRAFT or (
        config.draft == DEFAULT_DRAFT and is_store_name(config.target))


def choose_draft(config: Config) -> tuple[Config, str | None]:
    """``config`` with its draft settled (``wants_auto_draft``) and a note saying what ``auto``
    chose; unchanged, with no note, when the draft is not ``auto``'s to choose."""
    if not wants_auto_draft(config):
        return config, None
    target = _target(config)
    local, _ = survey(local_models(config).models)
    drafts = drafts_for(target, local) if target is not None else []
    if not drafts:
        why = ("no local model shares its vocabulary at about a third of its size"
               if target is not None else "it is not a readable GGUF file")
        return (dataclasses.replace(config, draft=AUTO_DRAFT, drafter="ngram"),
                f"draft auto: none for {config.target} ({why}); drafting from the conversation "
                "alone. `specchat models` lists the models found.")
    best = drafts[0]
    return (dataclasses.replace(config, draft=best.model.name),
            f"draft auto: {best.model.name} ({best.facts.parameters / 1e9:.2f}B parameters, "
            f"the vocabulary of {config.target})")


def _target(config: Config) -> Surveyed | None:
    """The target with the facts of its file, or None when its file has no readable GGUF
    header (a transformers folder, a damaged file)."""
    path = resolve_name(config.target, config)
    try:
        facts = model_facts(path)
    except (UnreadableModelError, OSError):
        return None
    return Surveyed(FoundModel(config.target, path, _store(config.target), path.stat().st_size),
                    facts)


def _store(name: str) -> str:
    """The store a model name points into (``ollama``...), "catalog" or "path"."""
    if name in CATALOG:
        return "catalog"
    return name.split(":", 1)[0] if is_store_name(name) else "path"
