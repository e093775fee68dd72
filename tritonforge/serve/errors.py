"""The error of a tritonserver that did not start or died, raised by every part of starting one (finding the
binary, checking its ports, watching it load)."""

from __future__ import annotations


class ServerError(RuntimeError):
    """The server did not start or died; the message quotes its log."""
