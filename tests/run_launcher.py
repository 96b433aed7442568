"""`specchat run` on the fakes of tests/serve_launcher.py (the exact fake target and the default
drafter, replies of at most 40 tokens), as `specchat serve` runs on them there:

    python -m tests.run_launcher RUN OPTIONS... PROMPT

Run from the repository root.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str]) -> int:
    import chatapp.assembly.loader
    from chatapp.cli import main as cli_main
    from tests.serve_launcher import FAKE_MODEL_OPTIONS, fake_factory

    factory = fake_factory(40, 0.0, False)
    chatapp.assembly.loader.build_session = (  # type: ignore[assignment]
        lambda config, progress, **_: factory(config, progress))
    return cli_main(["run", *FAKE_MODEL_OPTIONS, *argv])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
