"""`tritonforge`: build | serve | openai | eval | generate | probe | bench | tune | demo | make-model | make-tiny-model.

Every mistake a user can make here ends in one line on stderr that names the problem and what to do, with exit
status 2 for a usage error (a bad flag, path or port) and 1 for a runtime one (no server answers, a tool is
missing, the server failed); `-v` adds the detail (`main`)."""

from __future__ import annotations

import argparse
import logging
import sys

from ..builder.trtllm import EngineMismatch, TensorRTLLMMissing
from ..gateway import GatewayFailed
from ..tools.accuracy_gate import AccuracyGateFailed
from . import accuracy, bench, build, demo, gateway, generate, make_model, make_tiny_model, probe, serve, tune
from .arguments import RepositoryInUse, ToolMissing


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, or says it is required; a flag's default is off. An option
    whose default is None (nothing to show) says in its own help what not giving it does."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.help == argparse.SUPPRESS or "%(default)" in text:
            return text
        if action.required:
            return text if "required" in text else f"{text} (required)"
        if "default" in text:
            return text
        if action.nargs == 0 and action.dest not in ("help", "version"):
            return f"{text} (default: off)"
        if any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS)):
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """A usage error in one line (argparse's own prints the whole usage first), pointing to --help."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tritonforge")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


# The commands, in the order --help lists them; each module adds its parser and the function it runs.
COMMANDS = (build, serve, generate, probe, bench, tune, make_model, make_tiny_model, accuracy, gateway, demo)


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tritonforge", description=__doc__.split("\n\n")[0], formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what happens (INFO) and show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)

    for module in COMMANDS:
        module.add_parser(command)
    return parser


def _exit_status(error: BaseException) -> int | None:
    """2 for a usage error (the command line names something wrong), 1 for a runtime one; None: not ours."""
    from ..facts.errors import TritonforgeError
    from ..serve.errors import ServerError
    from ..serve.ports import PortInUse

    if isinstance(error, PortInUse):
        return 2
    if isinstance(error, TritonforgeError):  # a request's error (the server's answer among them), by its kind
        return error.codes.exit_status
    if isinstance(error, (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError)):
        return 2
    if isinstance(error, (ServerError, ToolMissing, RepositoryInUse, TensorRTLLMMissing, EngineMismatch,
                          AccuracyGateFailed, GatewayFailed, OSError)):
        return 1
    return None


def _advice(error: BaseException) -> str:
    """What to do, where the message does not say it."""
    from ..clients.client import ServerUnavailable

    if isinstance(error, ServerUnavailable) and not error.listening:
        return "; is `tritonforge serve` running there? (start it in another terminal, or pass --url HOST:PORT)"
    return ""


def one_line(error: BaseException) -> str:
    """An error's message in one line: its first, and where that only announces what follows ("...:"), the
    first line after it too (the reason, e.g. a log line); `-v` shows the rest."""
    lines = [line.strip() for line in str(error).strip().splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].endswith(":") and len(lines) > 1:
        return f"{lines[0]} {lines[1]}"
    return lines[0]


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the one place an error becomes a line and an exit status
        status = _exit_status(error)
        if args.verbose:
            logging.getLogger("tritonforge").exception("%s failed", args.command)
        if status is None:
            print(f"error: {type(error).__name__}: {error} (a bug: `tritonforge -v {args.command} ...` shows where)",
                  file=sys.stderr)
            return 1
        print(f"error: {one_line(error)}{_advice(error)}", file=sys.stderr)
        return status
