"""specchat never downloads: the environment that keeps the Hugging Face libraries off the network.

``stay_offline`` is called by the command line before anything else and by the transformers
backend before it imports transformers (so a test or a tool that loads the backend without the
command line is offline too). It only sets what is not set already.
"""

from __future__ import annotations

import os

OFFLINE_ENVIRONMENT = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
}


def stay_offline() -> None:
    """Keep the Hugging Face libraries off the network (variables already set are left alone)."""
    for name, value in OFFLINE_ENVIRONMENT.items():
        os.environ.setdefault(name, value)
