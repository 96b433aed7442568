"""The one error type front ends show to people as it is.

Every error specchat raises for something a user can fix (a missing model file, a config typo, an
overflowing context, an unreachable server) is a ``UserFacingError``: its message says what
happened and how to fix it, so the app, ``specchat run`` and the bench print it without a
traceback. Anything else reaching a front end is a bug.
"""

from __future__ import annotations


class UserFacingError(Exception):
    """Something the user can fix; ``str(error)`` says how."""


class RequestRefused(UserFacingError):
    """A request asks for what the loaded models cannot do (tools with a chat template that has
    none): the client's to change, so an API answers it as a bad request."""
