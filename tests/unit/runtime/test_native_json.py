"""The C++ backends' JSON reader (runtime/native/json.h), which reads a model's config, the byte table and the
replay engine's token file, held to Python's `json.loads` through a driver compiled here: what both read they
read alike, member order and repeated keys included; what Python refuses the C++ refuses, naming where; and
where the C++ is stricter (NaN, a lone surrogate escape, nesting past 256) it says so."""

import json
import subprocess

import pytest

from tritonforge.builder import native

from .native_programs import compile_program

DRIVER = native.RUNTIME.parents[1] / "tests" / "unit" / "runtime" / "native" / "json_driver.cc"
DEPTH_LIMIT = 256  # json.h's guard against a stack overflow on a hostile file

READ_ALIKE = [
    "{}", "[]", "0", "-0", "1E+2", "0.5", "-2.5e-3", "true", "false", "null", '""', '"\\/"', "  [ 1 , 2 ]\n\t",
    '{"a": [1, -2.5e3, true, false, null, "x\\n\\u00e9\\ud83d\\ude00"]}', '{"a": 1, "b": {"c": []}, "a": 2}',
    '"h\\u00e9llo \\"w\\\\orld\\""', '"caf\u00e9 \U0001f600"', "[" * DEPTH_LIMIT + "]" * DEPTH_LIMIT,
    '{"tokenizer_dir": {"string_value": "tokenizer"}}', "[11, 12, 13]",
]
REFUSED_ALIKE = [
    "", " ", "[1,]", '{"a" 1}', '{"a":1,}', "[1 2]", "01", "1.", ".5", "+1", "tru", '"\\x"', '"a', '{"a":1}}',
    '"\u0001"', "1 2", "[", "{", '{1: 2}', "[1,,2]", "-", "1e", '"\\u12"',
]
CPP_STRICTER = ["NaN", "Infinity", "-Infinity", '"\\ud800"', '"\\udc00 x"',
                "[" * (DEPTH_LIMIT + 2) + "]" * (DEPTH_LIMIT + 2)]


@pytest.fixture(scope="module")
def driver(tmp_path_factory):
    return compile_program([DRIVER], tmp_path_factory.mktemp("json") / "json_driver")


def read_in_cpp(driver, text: str) -> str:
    completed = subprocess.run([str(driver)], input=text.encode(), capture_output=True, timeout=60)
    assert completed.returncode == 0, completed.stderr
    return completed.stdout.decode().strip()


def canonical(value) -> str:
    """Python's reading in the driver's form (numbers kept as written, objects as their pairs in order)."""
    if value is None:
        return "n"
    if value is True or value is False:
        return "t" if value else "f"
    if isinstance(value, tuple) and value[0] == "number":
        return "#" + value[1]
    if isinstance(value, str):
        return "s" + value.encode("utf-8").hex()
    if isinstance(value, tuple) and value[0] == "object":
        return "{" + ",".join(f"{key.encode('utf-8').hex()}:{canonical(item)}" for key, item in value[1]) + "}"
    return "[" + ",".join(canonical(item) for item in value) + "]"


def read_in_python(text: str) -> str:
    def refuse(constant):
        raise ValueError(f"{constant} is not JSON")

    number = lambda literal: ("number", literal)  # noqa: E731 - kept as written, as json.h keeps it
    return canonical(json.loads(text, parse_int=number, parse_float=number, parse_constant=refuse,
                                object_pairs_hook=lambda pairs: ("object", pairs)))


@pytest.mark.parametrize("text", READ_ALIKE)
def test_what_python_reads_the_cpp_reads_alike(driver, text):
    assert read_in_cpp(driver, text) == f"ok {read_in_python(text)}"


@pytest.mark.parametrize("text", REFUSED_ALIKE)
def test_what_python_refuses_the_cpp_refuses_naming_the_byte(driver, text):
    with pytest.raises(ValueError):
        read_in_python(text)
    answer = read_in_cpp(driver, text)
    assert answer.startswith("error ") and " at byte " in answer, answer


@pytest.mark.parametrize("text", CPP_STRICTER, ids=["nan", "infinity", "minus-infinity", "lone-high-surrogate",
                                                     "lone-low-surrogate", "too-deep"])
def test_the_cpp_refuses_what_python_lets_through(driver, text):
    answer = read_in_cpp(driver, text)
    assert answer.startswith("error "), answer
