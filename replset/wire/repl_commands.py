"""Replica-set commands: the internal ones members send each other (`replSetHeartbeat`,
`replSetRequestVotes`, `replSetUpdatePosition`, `replSetGetRBID`), the operator's (`replSetReconfig`,
`replSetStepDown`, `replSetFreeze`, `replSetStepUp`, `replSetSyncFrom`, `resync`), and the
test-only `configureFailPoint`. Each one parses its arguments and hands over to
the replication coordinator.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from base.config import parse_config
from base.errors import MongoError
from base.member import MemberState
from base.numbers import INT32_MAX, MAX_CONFIG_VERSION, exact_int, finite_number
from replset.wire.commands import CommandContext, command

# The longest stepdown or freeze, in seconds: mongod reads replSetFreeze's seconds as an int32, and
# nothing longer is useful (68 years); it also keeps every deadline computed from them an int64.
MAX_WAIT_SECS = INT32_MAX


def _need_config(ctx: CommandContext) -> None:
    if ctx.node.config is None:
        raise MongoError(94, "no replset config has been received")


def _seconds(ctx: CommandContext, field: str, default: float) -> float:
    """A finite number of seconds (fractions allowed), at most `MAX_WAIT_SECS` in magnitude."""
    secs = finite_number(ctx.cmd.get(field, default), field)
    if abs(secs) > MAX_WAIT_SECS:
        raise MongoError(2, f"BSON field '{field}' value must be <= {MAX_WAIT_SECS}, actual value '{secs:g}'")
    return secs


@command("replSetHeartbeat")
async def cmd_repl_set_heartbeat(ctx: CommandContext) -> dict[str, Any]:
    return ctx.node.repl.on_heartbeat_request(ctx.cmd)


@command("replSetRequestVotes")
async def cmd_repl_set_request_votes(ctx: CommandContext) -> dict[str, Any]:
    return await ctx.node.repl.on_vote_request(ctx.cmd)


@command("replSetUpdatePosition")
async def cmd_repl_set_update_position(ctx: CommandContext) -> dict[str, Any]:
    return ctx.node.repl.on_update_position(ctx.cmd)


@command("replSetGetRBID")
async def cmd_repl_set_get_rbid(ctx: CommandContext) -> dict[str, Any]:
    """The rollback id: it changes whenever this member rolls back (initial sync checks it)."""
    _need_config(ctx)
    return {"rbid": ctx.node.rbid, "ok": 1.0}


@command("replSetSyncFrom")
async def cmd_repl_set_sync_from(ctx: CommandContext) -> dict[str, Any]:
    _need_config(ctx)
    host = ctx.cmd.get("replSetSyncFrom")
    if not isinstance(host, str) or ":" not in host:
        raise MongoError(2, "replSetSyncFrom needs a host:port string")
    previous = ctx.node.repl.sync_from(host.lower())
    reply: dict[str, Any] = {"syncFromRequested": host.lower(), "ok": 1.0}
    if previous:
        reply["prevSyncTarget"] = previous
    return reply


@command("replSetStepDown")
async def cmd_repl_set_step_down(ctx: CommandContext) -> dict[str, Any]:
    _need_config(ctx)
    force = bool(ctx.cmd.get("force", False))
    secs = _seconds(ctx, "replSetStepDown", 60)
    if secs <= 0:
        raise MongoError(2, "stepdown period must be a positive integer")
    # As mongod's (repl_set_commands.cpp): an exact integer (bsonExtractIntegerField), >= 0, <= the period.
    catch_up = exact_int(ctx.cmd.get("secondaryCatchUpPeriodSecs", 0 if force else 10), "secondaryCatchUpPeriodSecs")
    if catch_up < 0:
        raise MongoError(2, "secondaryCatchUpPeriodSecs period must be a positive or absent")
    if catch_up > secs:
        raise MongoError(2, "stepdown period must be longer than secondaryCatchUpPeriodSecs")
    await ctx.node.repl.step_down(secs, catch_up, force)
    return {"ok": 1.0}


@command("replSetFreeze")
async def cmd_repl_set_freeze(ctx: CommandContext) -> dict[str, Any]:
    _need_config(ctx)
    info = ctx.node.repl.freeze(_seconds(ctx, "replSetFreeze", 0))
    return {"info": info, "ok": 1.0} if info else {"ok": 1.0}


@command("replSetStepUp")
async def cmd_repl_set_step_up(ctx: CommandContext) -> dict[str, Any]:
    _need_config(ctx)
    node = ctx.node
    if node.is_primary:
        return {"ok": 1.0}
    if node.state is not MemberState.SECONDARY:
        raise MongoError(95, f"node is {node.state.name}, not SECONDARY")
    reason = "stepUpRequestSkipDryRun" if ctx.cmd.get("skipDryRun") else "stepUpRequest"
    if not await node.repl.run_election(reason, skip_dry_run=bool(ctx.cmd.get("skipDryRun"))):
        raise MongoError(125, "Election failed.")
    return {"ok": 1.0}


@command("replSetReconfig")
async def cmd_repl_set_reconfig(ctx: CommandContext) -> dict[str, Any]:
    _need_config(ctx)
    node = ctx.node
    raw = ctx.cmd.get("replSetReconfig")
    if not isinstance(raw, dict):
        raise MongoError(14, "replSetReconfig needs a config document")
    force = bool(ctx.cmd.get("force", False))
    if not node.is_primary and not force:
        raise MongoError(10107, "replSetReconfig should only be run on a writable PRIMARY. Current state "
                                f"{node.state.name};")
    current = node.config
    assert current is not None
    new = parse_config(raw)
    if new.name != current.name:
        raise MongoError(103, f"New and old configurations differ in replica set name; old was {current.name}, "
                              f"and new is {new.name}")
    if new.version <= current.version and not force:
        raise MongoError(103, f"New config version {new.version} must be greater than the current version "
                              f"{current.version}")
    if new.member_by_host(node.options.me) is None:
        # mongod's findSelfInConfig (repl_set_config_checks.cpp), forced or not: a member never installs
        # a config it is not in (it would go REMOVED and, forced, take the set's config with it).
        raise MongoError(74, f"No host described in new configuration with {{version: {new.version}, term: "
                             f"{new.term}}} for replica set {new.name} maps to this node")
    changed_voters = _voter_changes(current, new)
    if changed_voters > 1 and not force:
        raise MongoError(103, "Replica set configuration change can only add or remove one voting member "
                              f"at a time; this one changes {changed_voters}")
    version = new.version if new.version > current.version else current.version + 1
    if version > MAX_CONFIG_VERSION:
        # A forced reconfig takes the next version: after the largest one there is none.
        raise MongoError(93, f"BSON field 'version' value must be <= {MAX_CONFIG_VERSION}, actual value "
                             f"'{version}'")
    new = dataclasses.replace(new, version=version, term=node.term if not force else -1,
                              settings=dataclasses.replace(new.settings,
                                                           replica_set_id=current.settings.replica_set_id))
    await node.repl.install_config(new)
    return {"ok": 1.0}


def _voter_changes(old: Any, new: Any) -> int:
    old_voters = {m.host for m in old.members if m.votes > 0}
    new_voters = {m.host for m in new.members if m.votes > 0}
    return len(old_voters ^ new_voters)


@command("configureFailPoint")
async def cmd_configure_fail_point(ctx: CommandContext) -> dict[str, Any]:
    if not ctx.node.options.enable_test_commands:
        raise MongoError(59, "no such command: 'configureFailPoint'")
    if ctx.db != "admin":
        raise MongoError(13, "configureFailPoint may only be run against the admin database.")
    name = ctx.cmd.get("configureFailPoint")
    if not isinstance(name, str):
        raise MongoError(2, "configureFailPoint needs a fail point name")
    count = ctx.node.failpoints.configure(name, ctx.cmd.get("mode"), ctx.cmd.get("data"))
    return {"count": count, "ok": 1.0}


@command("resync")
async def cmd_resync(ctx: CommandContext) -> dict[str, Any]:
    """Drop this member's data (a copy goes to `<dbpath>/rollback/resync-*`) and initial-sync.

    As mongod's: refused on the primary (95 NotSecondary); `wait` (default true) waits for the
    initial sync to finish.
    """
    if ctx.db != "admin":
        raise MongoError(13, "resync may only be run against the admin database.")
    node = ctx.node
    if node.config is None:
        raise MongoError(94, "no replication yet active")
    backup = await node.repl.resync.resync("the resync command")
    if ctx.cmd.get("wait", True):
        await node.repl.resync.wait_done()
    reply: dict[str, Any] = {"info": "initial sync started" if node.state is MemberState.STARTUP2
                             else "initial sync done"}
    if backup is not None:
        reply["previousDataCopiedTo"] = backup
    reply["ok"] = 1.0
    return reply
