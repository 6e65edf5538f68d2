"""What `minions submit` checks before uploading: every record, as the splitter would."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest

from minions.cli.input_check import InputProblem, check_input


def test_a_good_file_gives_its_hash_and_count(tmp_path: Path) -> None:
    data = b'{"id": 1, "text": "a"}\n\n{"id": "b", "text": "c"}\n'
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    checked = check_input(path, "embedding")
    assert checked.sha256 == hashlib.sha256(data).hexdigest()
    assert checked.records == 2 and checked.size == len(data)


@pytest.mark.parametrize(("content", "kind", "expected"), [
    (b'{"id": 1, "text": "a"}\n{"id": 2, "text": 3}\n', "embedding", "line 2: text"),
    (b'{"id": 1, "text": "a"}\nnot json\n', "embedding", "line 2: invalid JSON"),
    (b'{"id": 1, "ms": 1}\n{"id": 1, "ms": 2}\n', "sleep", "line 2: duplicate id 1"),
    (b'{"id": 1, "text": "a"}\n', "completion", "line 1:"),
    (b"\n\n", "sleep", "no records"),
    (b'{"id": 1, "text": "a"}\n{"id": 2, "text": "hello"\n', "embedding",
     r"line 2: invalid JSON: .* at column 26$"),
])
def test_bad_records_are_named_by_line(tmp_path: Path, content: bytes, kind: str, expected: str) -> None:
    path = tmp_path / "in.jsonl"
    path.write_bytes(content)
    with pytest.raises(InputProblem, match=expected):
        check_input(path, kind)
