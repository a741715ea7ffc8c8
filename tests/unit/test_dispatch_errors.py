"""An unexpected exception in a command handler is answered with InternalError (1) and logged with its
traceback once; repeats are one line each, so a client cannot flood the log with them."""

from __future__ import annotations

import asyncio
import logging
from types import SimpleNamespace
from typing import Any

import pytest

from replset.wire import commands
from replset.wire.commands import CommandContext, Dispatcher


def test_an_unexpected_exception_is_internal_error_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    async def broken(ctx: CommandContext) -> dict[str, Any]:
        return {"value": ctx.cmd["missing"]}

    commands.COMMANDS["brokenForTest"] = commands.CommandSpec(broken, "any")
    try:
        dispatcher = Dispatcher(SimpleNamespace())  # type: ignore[arg-type]
        node = SimpleNamespace(config=None, options=SimpleNamespace(enable_test_commands=False))
        ctx = CommandContext(node, SimpleNamespace(), "admin", {"brokenForTest": 1})  # type: ignore[arg-type]
        with caplog.at_level(logging.ERROR, logger="replset.wire.commands"):
            replies = [asyncio.run(dispatcher.run(ctx)) for _ in range(3)]
    finally:
        del commands.COMMANDS["brokenForTest"]
    assert all((r["ok"], r["code"], r["codeName"]) == (0.0, 1, "InternalError") for r in replies)
    records = [r for r in caplog.records if "brokenForTest" in r.getMessage()]
    assert len(records) == 3
    assert records[0].exc_info is not None
    assert [r.exc_info for r in records[1:]] == [None, None]
    assert "again (3 times)" in records[2].getMessage()
