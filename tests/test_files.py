"""files.py: the one way a file that will be parsed is opened and its JSON read, so graph
files, checkpoints, lock files, kernel files and the database refuse the same things the same
way (each caller gives its own error class, the file's role and the fix)."""

from __future__ import annotations

import os
import socket

import pytest

from tensor_graphs.errors import ArgumentError, DatabaseError, SerializationError
from tensor_graphs.files import open_regular, parse_json, path_of, read_regular

FIX = "give a file written by the test"


def refusal(call, *fragments, error=SerializationError) -> str:
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


def _bound_socket(path) -> None:
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))  # the socket file stays after close


@pytest.mark.parametrize("make, kind", [
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.mkfifo(p), "a FIFO (named pipe)"),  # open() would wait for a writer
    (lambda p: _bound_socket(p), "a socket"),  # open() fails (ENXIO): still named
])
def test_only_regular_files_are_opened(tmp_path, make, kind):
    path = tmp_path / "thing"
    make(path)
    refusal(lambda: open_regular(path, "test file", FIX, DatabaseError),
            f"{path} is {kind}, not a regular file; {FIX}", error=DatabaseError)
    refusal(lambda: read_regular(path, "test file", FIX), f"{path} is {kind}")


def test_devices_missing_files_and_unreadable_ones(tmp_path):
    refusal(lambda: read_regular("/dev/null", "test file", FIX), "is a character device")
    refusal(lambda: read_regular(tmp_path / "nope", "test file", FIX),
            f"{tmp_path / 'nope'}: no such test file; check the path")
    locked = tmp_path / "locked"
    locked.write_text("{}")
    os.chmod(locked, 0)
    try:
        if os.getuid() != 0:  # root reads anything
            refusal(lambda: read_regular(locked, "test file", FIX),
                    f"cannot open test file {locked}: Permission denied")
    finally:
        os.chmod(locked, 0o600)


def test_a_path_that_is_no_path_is_an_argument_error(tmp_path):
    assert path_of(tmp_path, "test file") == str(tmp_path)
    assert path_of(os.fsencode(tmp_path), "test file") == str(tmp_path)
    for value in (0, None, 1.5):  # open(0) would read standard input
        refusal(lambda v=value: read_regular(v, "test file", FIX),
                "expected the path of a test file", type(value).__name__, error=ArgumentError)


def test_read_regular_refuses_what_no_file_of_its_role_is(tmp_path):
    path = tmp_path / "big"
    path.write_bytes(b"x" * (1 << 20))
    assert read_regular(path, "test file", FIX, most=1 << 20) == b"x" * (1 << 20)
    path.write_bytes(b"x" * ((1 << 20) + 1))
    refusal(lambda: read_regular(path, "test file", FIX, most=1 << 20),
            "is larger than 1 MiB, which no test file is")


@pytest.mark.parametrize("data, why", [
    (b"\xff\xfe{}", "it is not UTF-8 text (invalid start byte at byte 0)"),
    ("{", "it is not valid JSON (Expecting property name"),
    ("[" * 100_000 + "]" * 100_000, "its JSON is nested too deeply"),  # RecursionError
    ("[" + "9" * 5000 + "]", "it holds a number of thousands of digits"),  # ValueError
])
def test_parse_json_names_the_source_and_why(data, why):
    message = refusal(lambda: parse_json(data, "f.json, line 3", "test record", FIX,
                                         DatabaseError), error=DatabaseError)
    assert message.startswith(f"f.json, line 3 is not a test record: {why}"), message
    assert message.endswith(f"; {FIX}")


def test_parse_json_reads_what_is_json_and_lets_the_hook_refuse():
    assert parse_json(b'{"a": [1, 2.5, null]}', "f", "test record", FIX) == {"a": [1, 2.5, None]}

    def no_b(pairs):
        if any(k == "b" for k, _ in pairs):
            raise SerializationError("b is not allowed")
        return dict(pairs)

    refusal(lambda: parse_json('{"b": 1}', "f", "test record", FIX, object_pairs_hook=no_b),
            "b is not allowed")
