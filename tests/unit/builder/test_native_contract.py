"""`runtime/native/contract.h` is what `facts/` generates (a fact changed in Python reaches the C++ without a hand
edit), and the C++ BLS types none of the contract's names or messages itself."""

import re

from tritonforge.builder import native
from tritonforge.builder.native_contract import HEADER, _names, header_text
from tritonforge.facts import errors

CONVERTED = [native.BLS.source]  # the backends that read every name of theirs from contract.h


def test_the_committed_header_equals_the_generated_one():
    assert HEADER.read_text() == header_text(), (
        f"{HEADER} differs from what tritonforge/facts/ generates: never edit it by hand; run "
        f"python -m tritonforge.builder.native_contract")


def test_the_bls_types_no_name_or_message_of_the_contract():
    facts = {value for _, value in _names()} | {errors.UNAVAILABLE_PREFIX, errors.INTERNAL_PREFIX,
                                                str(errors.ResponseSendError())}
    for source in CONVERTED:
        literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', source.read_text()))
        assert not literals & facts, f"{source.name} types {sorted(literals & facts)}: use contract.h's names"
