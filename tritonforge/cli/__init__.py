"""The command line, `tritonforge COMMAND`: main.py builds the parser and turns an error into one line and an
exit status; reference_docs.py renders the reference pages from the same parser and the typed settings."""

from .main import main, make_parser

__all__ = ["main", "make_parser"]
