"""`runtime/native/contract.h` is what `facts/` generates (a fact changed in Python reaches the C++ without a hand
edit), and no C++ source types the contract's names, messages or its models' parameter keys itself."""

import dataclasses
import re

from tritonforge.builder import native
from tritonforge.builder.native_contract import HEADER, NATIVE_PARAMETERS, _names, header_text
from tritonforge.facts import errors

SOURCES = sorted(path for pattern in ("*.cc", "*.h") for path in native.RUNTIME.rglob(pattern)
                 if path != HEADER)


def test_the_committed_header_equals_the_generated_one():
    assert HEADER.read_text() == header_text(), (
        f"{HEADER} differs from what tritonforge/facts/ generates: never edit it by hand; run "
        f"python -m tritonforge.builder.native_contract")


def test_no_native_source_types_a_name_or_message_of_the_contract():
    facts = {value for _, value in _names()} | {errors.UNAVAILABLE_PREFIX, errors.INTERNAL_PREFIX,
                                                str(errors.ResponseSendError()), str(errors.ServerStopping())}
    facts |= {field.name for parameters in NATIVE_PARAMETERS.values() for field in dataclasses.fields(parameters)}
    assert native.BLS.source in SOURCES
    for source in SOURCES:
        literals = set(re.findall(r'"((?:[^"\\]|\\.)*)"', source.read_text()))
        assert not literals & facts, f"{source.name} types {sorted(literals & facts)}: use contract.h's names"
