"""specchat keeps the Hugging Face libraries offline (``chatapp.offline``)."""

from __future__ import annotations

import os

from chatapp.offline import OFFLINE_ENVIRONMENT, stay_offline


def test_stay_offline_sets_what_is_unset_and_keeps_what_is_set(monkeypatch) -> None:
    for name in OFFLINE_ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "0")
    stay_offline()
    assert os.environ["HF_HUB_OFFLINE"] == os.environ["TRANSFORMERS_OFFLINE"] == "1"
    assert os.environ["HF_HUB_DISABLE_TELEMETRY"] == "1"
    assert os.environ["HF_DATASETS_OFFLINE"] == "0"

