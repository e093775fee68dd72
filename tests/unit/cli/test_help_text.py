"""Every option of every command says what it does in --help: its default alone is no help."""

import re

from tritonforge.cli import make_parser

DEFAULT_ONLY = re.compile(r"^\s*(\(default: [^)]*\))?\s*$")


def test_every_option_of_every_command_has_help_beyond_its_default():
    parser = make_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    bare = [f"tritonforge {name} {'/'.join(action.option_strings) or action.dest}"
            for name, command in commands.items() for action in command._actions
            if action.dest != "help" and DEFAULT_ONLY.match(action.help or "")]
    assert bare == []
