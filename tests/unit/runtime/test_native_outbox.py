"""The C++ backends' sending rules (runtime/native/outbox.h, which the C++ BLS sends through) held to
runtime/sending.py's: seeded scripts of pieces, ends, failed sends and senders' turns played on both, step by step,
through a driver compiled here; and outbox.h's own senders under real threads."""

import random
import subprocess
from collections import deque

import pytest

from tritonforge.builder import native
from tritonforge.runtime.sending import Outbox

from .native_programs import compile_program

DRIVER = native.RUNTIME.parents[1] / "tests" / "unit" / "runtime" / "native" / "outbox_driver.cc"
SCRIPTS = 300
ROWS = 3


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return compile_program([DRIVER], tmp_path_factory.mktemp("outbox") / "outbox_driver")


class ScriptedSenders:
    """A test double of sending.Senders: rows wait in its queue until the script gives the oldest a turn (the real
    ones' order, on one thread), so that both languages see the same interleaving."""

    def __init__(self, said: list[str]):
        self.said = said
        self.queue: deque = deque()

    def schedule(self, outbox) -> None:
        self.said.append(f"scheduled {outbox.row}")
        self.queue.append(outbox)


def play_in_python(steps: list[str]) -> list[str]:
    """The script on sending.Outbox, said as the driver says it."""
    said: list[str] = []
    senders = ScriptedSenders(said)
    rows: dict[int, Outbox] = {}
    failing: set[int] = set()
    while_sending: dict[int, list[tuple[str, int]]] = {}

    def sender(row: int):
        def send(pieces: list[str]) -> bool:
            said.append(f"send {row} {','.join(pieces)}")
            for piece, size in while_sending.pop(row, []):  # the producer goes on while the send is in flight
                rows[row].add(piece, size)
            sent = row not in failing
            failing.discard(row)
            return sent
        return send

    for step in steps:
        words = step.split()
        if words[0] == "turn":
            if not senders.queue:
                said.append("nothing")
                continue
            outbox = senders.queue.popleft()
            said.append(f"turn {outbox.row}")
            if outbox.take_turn():
                said.append(f"again {outbox.row}")
                senders.queue.append(outbox)
            continue
        row = int(words[1])
        if words[0] == "row":
            rows[row] = Outbox(senders, sender(row), interval=int(words[2]))
            rows[row].row = row
        elif words[0] == "add":
            rows[row].add(words[2], int(words[3]))
        elif words[0] == "end":
            while_sending.pop(row, None)  # the producer is done: nothing follows a row's end
            rows[row].end(lambda rest, row=row: said.append(f"last {row} {','.join(rest)}"))
        elif words[0] == "fail":
            failing.add(row)
        elif words[0] == "while":
            while_sending.setdefault(row, []).append((words[2], int(words[3])))
    return said


def random_script(rng: random.Random) -> list[str]:
    """Rows with intervals of 1-3; pieces of 1-3 units (some coming while a send is in flight), ends, failed sends
    and turns, interleaved at random; then every row ends and the turns run until no row is queued."""
    steps = [f"row {row} {rng.randint(1, 3)}" for row in range(ROWS)]
    ended: set[int] = set()
    for index in range(rng.randint(5, 60)):
        row = rng.randrange(ROWS)
        kind = rng.choices(["add", "while", "turn", "end", "fail"], weights=[6, 2, 5, 1, 1])[0]
        if kind == "turn":
            steps.append("turn")
        elif row in ended:
            continue  # nothing follows a row's end
        elif kind in ("add", "while"):
            steps.append(f"{kind} {row} p{index} {rng.randint(1, 3)}")
        elif kind == "end":
            steps.append(f"end {row}")
            ended.add(row)
        else:
            steps.append(f"fail {row}")
    steps += [f"end {row}" for row in range(ROWS) if row not in ended]
    # Each turn sends or ends a row, or lets it go: this many drain any queue the steps above could leave.
    return steps + ["turn"] * (2 * len(steps))


def test_a_script_plays_alike_in_both_languages(driver):
    steps = ["row 0 2", "add 0 a 1", "add 0 b 1", "turn", "add 0 c 1", "end 0", "turn", "turn"]
    expected = ["scheduled 0", "turn 0", "send 0 a,b", "scheduled 0", "turn 0", "last 0 c", "nothing"]
    assert play_in_python(steps) == expected
    assert play_in_cpp(driver, steps) == expected


def test_after_a_failed_send_nothing_more_of_the_row_is_sent_and_its_end_comes_without_pieces(driver):
    steps = ["row 0 1", "add 0 a 1", "fail 0", "turn", "add 0 b 1", "end 0", "turn", "turn"]
    expected = ["scheduled 0", "turn 0", "send 0 a", "scheduled 0", "turn 0", "last 0 ", "nothing"]
    assert play_in_python(steps) == expected
    assert play_in_cpp(driver, steps) == expected


def play_in_cpp(driver, steps: list[str]) -> list[str]:
    completed = subprocess.run([str(driver), "script"], input="\n".join(steps) + "\n", capture_output=True,
                               text=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.splitlines()


def test_seeded_scripts_play_alike_in_both_languages(driver):
    rng = random.Random(20261208)
    for _ in range(SCRIPTS):
        steps = random_script(rng)
        python = play_in_python(steps)
        assert play_in_cpp(driver, steps) == python, steps
        # The script reached every kind of outcome the rules have, over the runs (checked below).
        assert sum(line.startswith("last ") for line in python) == ROWS, python


def test_the_scripts_reach_every_rule():
    """What the differential test is worth: its scripts merge pieces, hold them under an interval, fail sends
    (after which nothing of the row is sent) and give rows another turn."""
    rng = random.Random(20261208)
    said = [line for _ in range(SCRIPTS) for line in play_in_python(random_script(rng))]
    assert any(line.startswith("send ") and "," in line for line in said)
    assert any(line.startswith("again ") for line in said)
    assert any(line.startswith("last ") and line.count(",") >= 1 for line in said)
    assert any(line == "nothing" for line in said)
    assert sum(line.startswith("send ") for line in said) > SCRIPTS


def test_the_senders_threads_deliver_every_row_in_order_and_end_it_once(driver):
    completed = subprocess.run([str(driver), "threads", "16", "3000"], capture_output=True, text=True, timeout=120)
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "ok"
