"""The `specchat` command: the command line of ``chatapp.cli``, supervised by ``crash_guard``.

Nothing heavy is imported before the fork, so the supervising parent stays small.
"""

from __future__ import annotations

import sys


def main() -> None:
    from chatapp.crash_guard import supervised

    def run() -> int:
        from chatapp.cli import main as cli_main

        return cli_main()

    sys.exit(supervised(run))


if __name__ == "__main__":
    main()
