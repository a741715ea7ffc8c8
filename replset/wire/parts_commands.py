"""Part-log commands: parts tables (ClickHouse ReplicatedMergeTree semantics on the replica set).

A table's definition is a document of `<db>.system.parts` keyed by the table's name
(`oplog.parts.table.TableDef.to_document`), written through the primary as an ordinary
replicated insert and acknowledged at `w: "majority"` unless the command asks for another
write concern (a table every member may be asked to hold parts of should not exist on
one member only). Its state collections are `<db>.system.parts.<table>.*`; clients read
them but cannot write them (`system_namespaces`).

- `{createPartsTable: <name>, columns: [...], partitionBy: ..., orderBy: [...]}`:
  48 `NamespaceExists` if the table exists; 2 / 9 / 73 for a bad definition.
- `{dropPartsTable: <name>}`: 26 `NamespaceNotFound` if it does not exist; removes the
  definition and the table's state collections.
- `{insertBlock: <name>, rows: [{...}, ...] | arrow: <Arrow IPC stream bytes>, dedupToken: <string>,
  insertQuorum: 0 | N | "majority", quorumTimeoutMS: <ms>}` on any member: one block per partition,
  written as parts on this member and committed through the primary (`replset.parts.commit`); the
  reply lists each block's part and whether it was `deduplicated`. With a quorum above 1 the reply
  waits until that many members hold each new part, or says `quorumStatus: "pending"` when
  `quorumTimeoutMS` (ClickHouse's `insert_quorum_timeout`, 600 s) passes first - never an ambiguous
  failure: `insertStatus` answers later. The table is looked up before the rows are decoded (26 if it
  does not exist); they are decoded off the event loop and measured before the memory is taken (10334
  past `--maxDecodedBlockBytes`: `replset.parts.payload`), and one block writes at most
  `maxPartitionsPerInsertBlock` partitions (96, TooManyParts). A quorum insert is bounded:
  - a quorum above the data-bearing members this member sees alive (itself and those whose
    heartbeats answer, in any state) is refused at once, before anything is written:
    100 `UnsatisfiableWriteConcern`, "too few live replicas" (ClickHouse's TOO_FEW_LIVE_REPLICAS;
    mongod's answer to a `w` above the number of data-bearing members), no error label: the same
    insert fails again until members come back. `errInfo` lists the live replicas;
  - the commit through the primary and the quorum wait together end within `quorumTimeoutMS`
    (counted from the commit, once the blocks are written here). `quorumStatus: "pending"` only
    when the commit was confirmed (its write concern met); a commit not confirmed in time - no
    primary reached, or its write concern timed out (made on the primary, not yet on a majority:
    it may be rolled back) - is an error. A plain insert retries its commit for up to 60 s.
  An insert whose commit may or may not have happened fails with a retryable error, labelled
  `RetryableWriteError`, whose message says to send it again with the same dedupToken (the block
  dedup makes that safe): 6 `HostUnreachable`, or 189 `PrimarySteppedDown` when this member was the
  primary and stepped down meanwhile (shutdown and network codes pass through). Never a bare 10107.
- `{insertStatus: <name>, blockIds: [...] | dedupToken: <string>, insertQuorum: N}`: each block's
  state - `reached`, `pending` or `failed` for quorum inserts, `committed` for the others, `unknown`
  when no member committed it. With `insertQuorum`, measured against that quorum (holders counted),
  whatever quorum the block was first inserted with.
- `{alterDelete | alterUpdate | dropPartition: <name>, ..., sync: 0 | 1 | 2}`: ClickHouse's
  `mutations_sync`: return once recorded, once this member applied it, or once every data-bearing
  member did (MaxTimeMSExpired, 50, naming the members behind after 600 s).
- `{killPartsMutation: <name>, mutation: <id>}`: ClickHouse's KILL MUTATION.
- `{_partsCommit: <name>, blocks: [...], source, http, attempt, quorum, writeConcern}`: a member's
  commit of blocks it wrote, sent to the primary; only over a member connection. It waits for the
  write concern sent (a quorum insert's carries a wtimeout within what is left of its
  `quorumTimeoutMS`), and a timeout is a `writeConcernError` beside `ok: 1`, as mongod answers.
"""

from __future__ import annotations

import asyncio
import dataclasses
import uuid
from collections.abc import Callable
from typing import Any

from tenacity import AsyncRetrying, RetryError, retry_if_result, stop_after_delay, wait_exponential

from base.errors import MongoError
from oplog.entry import command_entry, delete_entry, insert_entry, update_entry
from oplog.parts.filters import filter_expression, update_expressions
from oplog.parts.table import alter_table, parse_table_def
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.alter import alter_definition, drop_partition, partition_of, record_mutation
from replset.parts.commit import (
    QUORUM_TIMEOUT_MS,
    check_takes_inserts,
    commit_here,
    insert_rows,
    new_attempt,
    parse_quorum,
    primary_body,
)
from replset.parts.insert import Block, load_table, logged_block
from replset.parts.names import state_ns, tables_ns
from replset.parts.payload import decode_block
from replset.parts.registry import REACHED
from replset.parts.views import mutations_view
from replset.wire.commands import CommandContext, command
from replset.wire.crud import run_write
from replset.write_concern import MAJORITY, parse_write_concern
from sync.peer import PeerError

BAD_VALUE = 2
INTERRUPTED = 11601
SYNC_WAIT_S = 600.0    # sync: 2 waits this long for every member
PROBE_TIMEOUT_S = 10.0
NAMESPACE_EXISTS = 48
NAMESPACE_NOT_FOUND = 26


def _majority_by_default(ctx: CommandContext) -> None:
    if ctx.cmd.get("writeConcern") is None:
        ctx.cmd["writeConcern"] = {"w": "majority"}


@command("createPartsTable", kind="write")
async def cmd_create_parts_table(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["createPartsTable"]
    table = dataclasses.replace(parse_table_def(ctx.db, name, ctx.cmd), uuid=str(uuid.uuid4()))
    if table.settings.zero_copy and ctx.node.options.parts_storage is None:
        raise MongoError(BAD_VALUE, f"parts table {table.ns}: zeroCopy keeps part files in the set's shared "
                                    "storage, and this member has none (start every member with --partsStorage)")
    ns = tables_ns(ctx.db)
    _majority_by_default(ctx)

    def body(env: WriteEnv) -> dict[str, Any]:
        if env.txn.get(ns, name) is not None:
            raise MongoError(NAMESPACE_EXISTS, f"parts table {table.ns} already exists")
        ensure_collection(env, ns)
        env.emit(insert_entry(ns, table.to_document()))
        return {"ok": 1.0}

    return await run_write(ctx, body)


@command("dropPartsTable", kind="write")
async def cmd_drop_parts_table(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["dropPartsTable"]
    ns = tables_ns(ctx.db)
    state_prefix = f"{ns}.{name}."
    _majority_by_default(ctx)

    def body(env: WriteEnv) -> dict[str, Any]:
        if env.txn.get(ns, name) is None:
            raise MongoError(NAMESPACE_NOT_FOUND, f"parts table {ctx.db}.{name} not found")
        env.emit(delete_entry(ns, name))
        for info in env.txn.collections(ctx.db):
            if info.ns.startswith(state_prefix):
                env.emit(command_entry(ctx.db, {"drop": info.ns.partition(".")[2]}, info.uuid))
        return {"ok": 1.0}

    return await run_write(ctx, body)


@command("insertBlock")
async def cmd_insert_block(ctx: CommandContext) -> dict[str, Any]:
    name = ctx.cmd["insertBlock"]
    check_takes_inserts(ctx.node)
    quorum = parse_quorum(ctx.cmd.get("insertQuorum", 0), ctx.node.config)
    # The table first, then the rows: decoded off the event loop, bounded by their decoded size.
    data = await decode_block(ctx.node, ctx.db, name, rows=ctx.cmd.get("rows"), arrow=ctx.cmd.get("arrow"),
                              what="insertBlock")
    _majority_by_default(ctx)
    return await insert_rows(ctx.node, ctx.db, name, data, wc=parse_write_concern(ctx.cmd["writeConcern"]),
                             dedup_token=ctx.cmd.get("dedupToken"), quorum=quorum,
                             quorum_timeout_ms=int(ctx.cmd.get("quorumTimeoutMS", QUORUM_TIMEOUT_MS)))


def member_source(ctx: CommandContext) -> tuple[str, str]:
    """The member a `_partsCommit` / `_partsStage` names as holding the parts, and the HTTP address its
    heartbeats give (never one the message gives); BadValue if it is no member whose address is known."""
    source = ctx.cmd.get("source")
    http = ctx.node.http_of(source) if isinstance(source, str) else None
    if http is None:
        raise MongoError(BAD_VALUE, f"{ctx.name}: source {source!r} is not a member of the set whose HTTP "
                                    "port is known")
    return str(source), http


@command("_partsCommit", kind="write")
async def cmd_parts_commit(ctx: CommandContext) -> dict[str, Any]:
    """Another member's commit of blocks it wrote (`replset.parts.commit.PrimaryLink`). With auth on,
    only a member (logged in with the keyfile) may send it (replset/auth/roles.py). The parts' source
    must be a member of the config, and where its files are fetched from is what that member says in
    its heartbeats, never what the message says (replset/member_http.py). The write concern's wtimeout
    bounds the wait, so the sender hears "committed, not confirmed" before it stops waiting."""
    name = ctx.cmd["_partsCommit"]
    source, http = member_source(ctx)
    raw_blocks = ctx.cmd.get("blocks")
    if not isinstance(raw_blocks, list) or not raw_blocks:
        raise MongoError(BAD_VALUE, "_partsCommit needs a non-empty blocks array")
    blocks = [Block.from_wire(b) for b in raw_blocks]
    token = ctx.cmd.get("dedupToken")
    body = primary_body(ctx.db, name, blocks, source=source, http=http,
                        attempt=str(ctx.cmd.get("attempt", "")), quorum=int(ctx.cmd.get("quorum", 0)),
                        dedup_token=None if token is None else str(token), directory=None, clock=ctx.node.clock)
    return await commit_here(ctx.node, parse_write_concern(ctx.cmd.get("writeConcern") or {"w": MAJORITY}), body,
                             off_loop=len(blocks) > 1)   # a check and numbers per block


@command("insertStatus")
async def cmd_insert_status(ctx: CommandContext) -> dict[str, Any]:
    """Where each block of an insert stands, on any member (what it has replicated so far). With
    `insertQuorum`, a block's status is measured against that quorum (`registry.quorum_status`)."""
    name = ctx.cmd["insertStatus"]
    reader = ctx.node.store.reader
    table = load_table(reader, ctx.db, name)
    log_ns, quorum_ns = state_ns(ctx.db, name, "log"), state_ns(ctx.db, name, "quorum")
    block_ids, token = ctx.cmd.get("blockIds"), ctx.cmd.get("dedupToken")
    if (block_ids is None) == (token is None):
        raise MongoError(BAD_VALUE, "insertStatus takes exactly one of 'blockIds' and 'dedupToken'")
    required = parse_quorum(ctx.cmd["insertQuorum"], ctx.node.config) if "insertQuorum" in ctx.cmd else None
    if token is not None:
        if not isinstance(token, str):
            raise MongoError(BAD_VALUE, "insertStatus: dedupToken must be a string")
        block_ids = await _blocks_of_token(ctx, table.ns, log_ns, token)
    if not isinstance(block_ids, list) or not all(isinstance(b, str) for b in block_ids):
        raise MongoError(BAD_VALUE, "insertStatus: blockIds must be an array of strings")
    out = []
    for block_id in block_ids:
        log_doc = logged_block(reader, ctx.db, name, block_id)
        quorum_doc = reader.get(quorum_ns, block_id) if reader.collection(quorum_ns) else None
        if required is not None and log_doc is not None:
            status = ctx.node.parts.quorum_statuses(table.ns, [(block_id, str(log_doc["part"]))], required)[0]
        elif quorum_doc is not None:
            status = str(quorum_doc.get("status"))
        else:
            status = "committed" if log_doc is not None else "unknown"
        row: dict[str, Any] = {"blockId": block_id, "status": status}
        if log_doc is not None:
            row["part"] = log_doc["part"]
        out.append(row)
    return {"blocks": out, "allReached": all(r["status"] in (REACHED, "committed") for r in out) and bool(out),
            "ok": 1.0}


async def _blocks_of_token(ctx: CommandContext, ns: str, log_ns: str, token: str) -> list[str]:
    """The blocks of the inserts that carried `token`: from the part-log runner's index; while it is
    rebuilding, a scan of the log (on the query pool, never on the loop)."""
    rt = ctx.node.parts.tables.get(ns)
    if rt is not None:
        return list(rt.block_ids_by_token.get(token, []))

    def by_token() -> list[Any]:
        thread_reader = ctx.node.store.thread_reader()
        if thread_reader.collection(log_ns) is None:
            return []
        return [d["_id"] for d in thread_reader.scan(log_ns) if d.get("dedupToken") == token]
    return list(await ctx.node.queries.run(by_token))


# -- mutations and drops --------------------------------------------------------------------------


async def _on_primary(ctx: CommandContext, body: Callable[[WriteEnv], dict[str, Any]], *,
                      off_loop: bool = False) -> dict[str, Any]:
    """Runs `body` as a w:"majority" write on the primary: here, or by passing the command on."""
    ctx.cmd.setdefault("attempt", new_attempt())
    forwarded = {k: v for k, v in ctx.cmd.items() if not k.startswith("$") and k not in ("lsid", "txnNumber")}
    if ctx.name == "alterPartsTable":
        forwarded["alterSync"] = 0   # the waiting, if any, happens here
    elif ctx.name in ("alterDelete", "alterUpdate", "dropPartition"):
        forwarded["sync"] = 0

    async def here() -> dict[str, Any]:
        wc = parse_write_concern(ctx.cmd.get("writeConcern") or {"w": MAJORITY})
        return await commit_here(ctx.node, wc, body, off_loop=off_loop)

    return await ctx.node.parts.link.on_primary(ctx.db, forwarded, here)


def _sync(ctx: CommandContext) -> int:
    raw = ctx.cmd.get("sync", 1)
    if isinstance(raw, bool) or raw not in (0, 1, 2):
        raise MongoError(BAD_VALUE, "'sync' must be 0 (return once recorded), 1 (once this member applied it) "
                                    "or 2 (once every data-bearing member applied it)")
    return int(raw)


async def _wait_on_every_member(ctx: CommandContext, what: str, done_on: Callable[[dict[str, Any]], bool],
                                probe: dict[str, Any]) -> None:
    """`sync: 2` (ClickHouse's `mutations_sync = 2`): until every other data-bearing member answers `probe`
    with a reply `done_on` accepts, polled with backoff for up to `SYNC_WAIT_S`; MaxTimeMSExpired (50)
    naming the members not done (down, or behind) past that."""
    config, me = ctx.node.config, ctx.node.options.me
    others = {m.host for m in config.members if m.data_bearing and m.host != me} if config is not None else set()

    async def not_done() -> set[str]:
        async def ask(host: str) -> bool:
            try:
                return done_on(await ctx.node.parts.link.ask(host, ctx.db, probe, PROBE_TIMEOUT_S))
            except PeerError:
                return False
            except MongoError as exc:
                if exc.code == INTERRUPTED:
                    raise
                return False
        hosts = sorted(others)
        answers = await asyncio.gather(*(ask(h) for h in hosts))
        return {h for h, ok in zip(hosts, answers, strict=True) if not ok}

    retrying = AsyncRetrying(retry=retry_if_result(bool), stop=stop_after_delay(SYNC_WAIT_S),
                             wait=wait_exponential(multiplier=0.05, max=1.0))
    try:
        await retrying(not_done)
    except RetryError as exc:
        behind = exc.last_attempt.result()
        raise MongoError(50, f"{what} is not done on {', '.join(sorted(behind))} within {SYNC_WAIT_S:.0f} s "
                             "(it goes on there)") from None


def _mutation_done(mutation_id: str) -> Callable[[dict[str, Any]], bool]:
    def done(reply: dict[str, Any]) -> bool:
        row = next((m for m in reply.get("mutations", []) if m.get("mutation_id") == mutation_id), None)
        if row is not None and row.get("is_killed"):
            raise MongoError(INTERRUPTED, f"mutation {mutation_id} was killed")
        return row is not None and bool(row.get("is_done"))
    return done


async def _mutation(ctx: CommandContext, kind: str) -> dict[str, Any]:
    name = ctx.cmd[ctx.name]
    table = load_table(ctx.node.store.reader, ctx.db, name)
    filter_doc = ctx.cmd.get("filter")
    if not isinstance(filter_doc, dict):
        raise MongoError(BAD_VALUE, f"{ctx.name} needs a 'filter' object (use {{}} for every row)")
    set_doc = ctx.cmd.get("set") or {}
    filter_expression(filter_doc, table)   # refused here, before anything is sent or written
    if kind == "update":
        update_expressions(set_doc, table)
    sync = _sync(ctx)
    attempt = str(ctx.cmd.setdefault("attempt", new_attempt()))
    reply = await _on_primary(ctx, lambda env: {"mutation": record_mutation(
        env, ctx.db, name, kind=kind, filter_doc=filter_doc, set_doc=set_doc, attempt=attempt)["_id"], "ok": 1.0})
    if sync:
        await ctx.node.parts.wait_mutation(table.ns, str(reply["mutation"]))
    if sync == 2:
        await _wait_on_every_member(ctx, f"mutation {reply['mutation']}", _mutation_done(str(reply["mutation"])),
                                    {"partsMutations": name})
    return {k: v for k, v in reply.items() if k in ("mutation", "writeConcernError", "ok")}


@command("alterDelete")
async def cmd_alter_delete(ctx: CommandContext) -> dict[str, Any]:
    """`{alterDelete: <table>, filter: {...}, sync: 0 | 1}`: ClickHouse's ALTER TABLE ... DELETE WHERE."""
    return await _mutation(ctx, "delete")


@command("alterUpdate")
async def cmd_alter_update(ctx: CommandContext) -> dict[str, Any]:
    """`{alterUpdate: <table>, filter: {...}, set: {col: value | "$col" | {$add: [...]}}, sync: 0 | 1}`."""
    return await _mutation(ctx, "update")


@command("dropPartition")
async def cmd_drop_partition(ctx: CommandContext) -> dict[str, Any]:
    """`{dropPartition: <table>, partition: "<id>" | {value: v}, sync: 0 | 1}`: ClickHouse's DROP PARTITION."""
    name = ctx.cmd["dropPartition"]
    table = load_table(ctx.node.store.reader, ctx.db, name)
    pid = partition_of(table, ctx.cmd.get("partition"))
    sync = _sync(ctx)
    attempt = str(ctx.cmd.setdefault("attempt", new_attempt()))
    reply = await _on_primary(ctx, lambda env: {"dropRange": drop_partition(env, ctx.db, name, pid, attempt),
                                                "ok": 1.0}, off_loop=True)
    if sync and reply.get("dropRange"):
        await ctx.node.parts.wait_dropped(table.ns, str(reply["dropRange"]))
    if sync == 2 and reply.get("dropRange"):
        drop_id = f"drop_{reply['dropRange']}"

        def dropped(answer: dict[str, Any]) -> bool:   # the drop's task has left that member's queue
            return not any(row.get("node_name") == drop_id for row in answer.get("queue", []))

        await _wait_on_every_member(ctx, f"the drop of partition {pid}", dropped, {"partsReplicationQueue": name})
    return {k: v for k, v in reply.items() if k in ("dropRange", "writeConcernError", "ok")}


@command("killPartsMutation")
async def cmd_kill_parts_mutation(ctx: CommandContext) -> dict[str, Any]:
    """`{killPartsMutation: <table>, mutation: <id>}`: ClickHouse's KILL MUTATION. No more parts are planned
    for the mutation; the rewrites already in the log still run on every member (the same bytes
    everywhere), and what it rewrote stays. A `sync` wait on it fails with Interrupted (11601). The reply
    lists the mutations it killed ([] when that one is unknown or killed before).

    A mutation that has finished is killed like any other, as ClickHouse's KILL MUTATION does (it
    selects from `system.mutations` whatever `is_done` says, and removes the entry): the reply names it,
    and nothing changes but `is_killed` - its rewrites are all done, so `partsMutations` keeps saying
    `is_done: true` on every member where it was done (`is_done` is a fact about a member's parts, see
    `oplog.parts.mutations.mutation_done`). Whether it had finished is not decided here, so the kill
    needs no view of the other members: one done on the primary but not yet on a lagging member is
    killed too - nothing more is planned for it and the waits on it end with Interrupted, as in
    ClickHouse - and the lagging member, once its logged rewrites ran, shows it done as well."""
    name = ctx.cmd["killPartsMutation"]
    table = load_table(ctx.node.store.reader, ctx.db, name)
    mutation_id = ctx.cmd["mutation"]
    if not isinstance(mutation_id, str):
        raise MongoError(BAD_VALUE, "killPartsMutation: 'mutation' must be a mutation id string")
    mutations_ns = state_ns(ctx.db, table.name, "mutations")

    def body(env: WriteEnv) -> dict[str, Any]:
        doc = env.txn.get(mutations_ns, mutation_id) if env.txn.collection(mutations_ns) is not None else None
        if doc is None or doc.get("killed"):
            return {"killed": [], "ok": 1.0}
        env.emit(update_entry(mutations_ns, mutation_id, {"$set": {"killed": True, "killTime": env.now}}))
        return {"killed": [mutation_id], "ok": 1.0}

    reply = await _on_primary(ctx, body)
    return {k: v for k, v in reply.items() if k in ("killed", "writeConcernError", "ok")}


@command("partsMutations")
async def cmd_parts_mutations(ctx: CommandContext) -> dict[str, Any]:
    """`system.mutations`-like rows: each mutation and, on this member, the parts it has yet to rewrite,
    whether it is done, and its rewrite that failed last here (`latest_failed_part`, `latest_fail_time`
    - a UTC datetime, 1970-01-01 when none is failing, as in ClickHouse - and `latest_fail_reason`)."""
    table = load_table(ctx.node.store.reader, ctx.db, ctx.cmd["partsMutations"])
    return {"mutations": mutations_view(ctx.node, table), "ok": 1.0}


# -- schema changes -------------------------------------------------------------------------------


def _alter_sync(ctx: CommandContext) -> int:
    raw = ctx.cmd.get("alterSync", 1)
    if isinstance(raw, bool) or raw not in (0, 1, 2):
        raise MongoError(BAD_VALUE, "'alterSync' is 0 (return once recorded), 1 (once this member has the new "
                                    "metadata) or 2 (once every member has it)")
    return int(raw)


@command("alterPartsTable")
async def cmd_alter_parts_table(ctx: CommandContext) -> dict[str, Any]:
    """`{alterPartsTable: <table>, addColumn: {name, type, default} | dropColumn: <name> |
    renameColumn: {from, to}, alterSync: 0 | 1 | 2}`: one schema change, one metadata version up.

    The definition and an ALTER_METADATA log entry are written together; every member's queue adopts
    the new version when it reaches that entry. Parts keep the columns they were written with and read
    through the changes made since (`oplog.parts.part_files.read_part`). `alterSync` (ClickHouse's
    `alter_sync`): 0 returns once the primary has it, 1 once a majority and this member have it, 2 once
    every data-bearing member has it (the write concern counts every one of them)."""
    name = ctx.cmd["alterPartsTable"]
    table = load_table(ctx.node.store.reader, ctx.db, name)
    spec = {k: ctx.cmd[k] for k in ("addColumn", "dropColumn", "renameColumn") if k in ctx.cmd}
    alter_table(table, spec)   # a bad change is refused here, before anything is sent
    sync = _alter_sync(ctx)
    config = ctx.node.config
    everyone = sum(1 for m in config.members if m.data_bearing) if config is not None else 1
    # A member passing the command on sends the write concern its alterSync needs (and alterSync 0).
    ctx.cmd.setdefault("writeConcern", {"w": 1} if sync == 0 else {"w": everyone} if sync == 2 else {"w": MAJORITY})
    attempt = str(ctx.cmd.setdefault("attempt", new_attempt()))
    reply = await _on_primary(ctx, lambda env: {"metadataVersion": alter_definition(env, ctx.db, name, spec, attempt),
                                                "ok": 1.0})
    if sync:
        await ctx.node.parts.wait_metadata(table.ns, int(reply["metadataVersion"]))
    return {k: v for k, v in reply.items() if k in ("metadataVersion", "writeConcernError", "ok")}
