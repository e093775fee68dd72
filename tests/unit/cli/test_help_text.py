"""Every option of every command says what it does in --help (its default alone is no help), and shows its default
or says it is required; serve's build options are under headings that say they are for a checkpoint."""

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


def test_every_option_of_every_command_shows_its_default_or_says_it_is_required():
    parser = make_parser()
    commands = next(action for action in parser._actions if action.dest == "command").choices
    silent = []
    for name, command in commands.items():
        formatter = command._get_formatter()
        silent += [f"tritonforge {name} {'/'.join(action.option_strings)}" for action in command._actions
                   if action.option_strings and action.dest != "help"
                   and not re.search(r"default|required", formatter._get_help_string(action))]
    assert silent == []


def test_serve_help_puts_every_build_option_under_a_heading_for_a_checkpoint_only():
    parser = make_parser()
    serve = next(action for action in parser._actions if action.dest == "command").choices["serve"]
    build_flags = {flag for group in serve._action_groups if "CHECKPOINT only" in (group.title or "")
                   for action in group._group_actions for flag in action.option_strings}
    build = next(action for action in parser._actions if action.dest == "command").choices["build"]
    taken = {flag for action in build._actions for flag in action.option_strings} - {
        "-h", "--help", "--model", "--output", "--force", "--dry-run"}
    assert taken - build_flags == set()
