"""What each thread count cost a model on this machine, kept from one start to the next.

``AdaptiveThreads`` judges its first evaluations against these costs (an evaluation far dearer
than remembered means the machine is busy: try fewer threads at once). The file is
``<user state dir>/threads/<key>.json``, the key made of the model file, the machine's CPU and
its core count. A run's costs are merged into the file by keeping, per count and size, the
cheaper of the two: the expectation is the quiet machine's. A file that is missing or unreadable
counts as empty, and a write that fails is skipped: the memory only saves a few slow tokens.
"""

from __future__ import annotations

import hashlib
import platform
from pathlib import Path

from chatapp.user_files import read_json_object, remember_json, state_dir


def memory_path(model: Path, cores: int) -> Path:
    """Where the costs of ``model`` on this machine with ``cores`` cores are kept."""
    try:
        size = model.stat().st_size
    except OSError:
        size = -1
    what = [model.name, str(size), str(cores), platform.machine(), platform.processor(),
            _cpu_model()]
    key = hashlib.sha256("\0".join(what).encode()).hexdigest()[:24]
    return state_dir() / "threads" / f"{key}.json"


def recall(path: Path) -> dict[str, float]:
    """The costs kept in ``path`` (empty when there are none or they cannot be read)."""
    return read_json_object(path)


def remember(costs: dict[str, float], path: Path) -> None:
    """Merge ``costs`` into ``path``, keeping the cheaper cost of each entry; failures skipped."""
    if not costs:
        return
    merged = dict(recall(path))
    for key, cost in costs.items():
        old = merged.get(key)
        merged[key] = cost if not isinstance(old, (int, float)) else min(float(old), cost)
    remember_json(path, merged, indent=1)


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text(errors="replace").splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return ""
