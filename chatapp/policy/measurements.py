"""The automatic draft length's measurements, kept from one start to the next.

``AutoDraftLength`` learns this machine's costs (verifying n tokens, a draft token, the catch-up
of an idle draft model) and each drafter's acceptance during the first reply; without a memory
every start pays for that again. ``recall`` starts a policy from what the last run with the same
machine, backends, models, drafter and threads measured; ``remember`` writes it after a reply.

The file is ``<user state dir>/auto-policy/<key>.json`` (``~/.local/state/specchat`` on Linux),
0600 in 0700 folders, written atomically; beside it ``<key>.costs.json`` holds the machine's
calibration (``chatapp.engine.calibration``), which ``recall`` gives the policy too. The key
names this CPU (its model and vector features, and whether AMX is kept off), so what was measured
on another machine is never applied. A file that is missing, unreadable or of another
version is ignored and a write that fails is skipped: the memory only saves time, so it never
stops a chat. Several processes may share a file (the app and ``specchat serve`` with the same
pair): a write keeps what the file holds of sources the writing policy never saw.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chatapp.backends.amx_guard import cpu_description, forced_off
from chatapp.engine.calibration import Calibration
from chatapp.policy.auto import AutoDraftLength
from chatapp.user_files import remember_json, state_dir

_UNREADABLE = (OSError, ValueError, TypeError, KeyError, AttributeError)


def memory_path(setup: Sequence[str]) -> Path:
    """Where the measurements of a setup are kept: ``setup`` names everything that changes what
    the policy measures (backends, models, drafter, threads, layouts: the settings'
    ``Config.measured_setup``), with this machine's CPU (``cpu_description``), core count and
    whether AMX is kept off (``SPECCHAT_AMX=off``)."""
    machine = [cpu_description(), str(os.cpu_count()), f"amx-off={forced_off(os.environ)}"]
    key = hashlib.sha256("\0".join([*setup, *machine]).encode()).hexdigest()[:24]
    return state_dir() / "auto-policy" / f"{key}.json"


def calibration_path(path: Path) -> Path:
    """Where the calibration of the setup whose memory is ``path`` is kept."""
    return path.with_name(f"{path.stem}.costs.json")


def recall(policy: AutoDraftLength, path: Path) -> bool:
    """Start ``policy`` from the calibration beside ``path`` and the measurements in ``path``;
    False if there were no measurements (the calibration is applied anyway)."""
    calibration = recall_calibration(path)
    if calibration is not None:
        policy.calibrate(calibration)
    return _resume(policy, path)


def _resume(policy: AutoDraftLength, path: Path) -> bool:
    """Resume ``policy`` from the measurements in ``path``; False (untouched) if none."""
    try:
        policy.resume(json.loads(path.read_text(encoding="utf-8")))
    except _UNREADABLE:
        return False
    return True


def recall_calibration(path: Path) -> Calibration | None:
    """The calibration kept beside the memory ``path``, or None (none, or unreadable)."""
    try:
        return Calibration.from_data(
            json.loads(calibration_path(path).read_text(encoding="utf-8")))
    except _UNREADABLE:
        return None


def remember_calibration(calibration: Calibration, path: Path) -> None:
    """Keep ``calibration`` beside the memory ``path`` (atomically, 0600; failures skipped)."""
    remember_json(calibration_path(path), calibration.as_data())


def remember(policy: AutoDraftLength, path: Path) -> None:
    """Write ``policy``'s measurements to ``path`` (atomically, 0600), with the file's own
    per-source data of sources ``policy`` has none of (another process's, written since
    ``policy`` was recalled); failures are skipped."""
    learnt = policy.learnt()
    learnt["arms"] = {**_valid_arms(path, policy), **learnt["arms"]}
    remember_json(path, learnt)


def _valid_arms(path: Path, policy: AutoDraftLength) -> dict[str, Any]:
    """The per-source data in ``path`` if a policy like ``policy`` could resume from the file,
    else nothing."""
    probe = AutoDraftLength(policy.tuning)
    if not _resume(probe, path):
        return {}
    return probe.learnt()["arms"]
