"""The agent's answer must equal the expected count kept next to this file (the agent never sees it)."""

from pathlib import Path


def test_answer_file_exists() -> None:
    assert Path("/app/answer.txt").is_file()


def test_answer_is_the_expected_count() -> None:
    expected = (Path(__file__).parent / "answer.txt").read_text().strip()
    assert Path("/app/answer.txt").read_text().strip() == expected
