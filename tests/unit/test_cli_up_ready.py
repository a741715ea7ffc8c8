"""`replset up` says the set is up only once every member is PRIMARY or SECONDARY (`_wait_ready`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from replset import cli


class _Admin:
    def __init__(self, answers: list[list[str]]) -> None:
        self.answers = answers
        self.asked = 0

    def command(self, name: str) -> dict[str, Any]:
        assert name == "replSetGetStatus"
        states = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return {"members": [{"name": f"m{i}", "stateStr": s} for i, s in enumerate(states)]}


class _Client:
    def __init__(self, answers: list[list[str]]) -> None:
        self.admin = _Admin(answers)


def _polling(limit: int) -> Callable[[Callable[[], Any], float, str], Any]:
    def wait(predicate: Callable[[], Any], _timeout_s: float, what: str) -> Any:
        for _ in range(limit):
            if result := predicate():
                return result
        raise TimeoutError(what)
    return wait


def test_it_waits_for_members_still_syncing_and_says_which(capsys: pytest.CaptureFixture[str]) -> None:
    client = _Client([["PRIMARY", "STARTUP2", "STARTUP2"], ["PRIMARY", "SECONDARY", "STARTUP2"],
                      ["PRIMARY", "SECONDARY", "SECONDARY"]])
    cli._wait_ready(client, _polling(10))
    assert client.admin.asked == 3   # one look, then until every member is ready
    assert capsys.readouterr().out == "a primary is elected; waiting for m1 (STARTUP2), m2 (STARTUP2) to finish syncing\n"


def test_a_ready_set_is_up_at_once_and_one_never_ready_is_named(capsys: pytest.CaptureFixture[str]) -> None:
    cli._wait_ready(_Client([["PRIMARY", "SECONDARY"]]), _polling(1))
    assert capsys.readouterr().out == ""
    cli._wait_ready(_Client([["PRIMARY", "RECOVERING"]]), _polling(3))
    assert capsys.readouterr().out.splitlines()[-1] == (
        f"warning: m1 (RECOVERING) not PRIMARY or SECONDARY after {cli.READY_TIMEOUT_S:g} s")
