"""Handshake, diagnostics, DDL and replica-set admin commands."""

from __future__ import annotations

import datetime
import platform
import socket
import uuid
from typing import TYPE_CHECKING, Any

from bson.binary import Binary
from bson.int64 import Int64

from base.errors import MongoError
from base.hello import MAX_BSON_OBJECT_SIZE, build_hello
from oplog.apply import COLLMOD_OPTIONS
from oplog.capped import capped_limits, check_capped_options
from oplog.clustered import check_clustered_options, clustered_index_spec, is_clustered
from oplog.entry import command_entry
from oplog.parts.storage_url import redact_url
from oplog.query import compile_filter
from oplog.timeseries import buckets_name
from oplog.ttl import check_ttl_spec
from oplog.views import view_definition
from oplog.writes import WriteEnv, ensure_collection, new_collection_uuid, validate_namespace
from replset import __version__
from replset.auth.access import visible_databases
from replset.cursors import Cursor
from replset.status import replset_status
from replset.structured_log import RECENT
from replset.wire import system_namespaces
from replset.wire.auth_commands import hello_auth_fields
from replset.wire.commands import CommandContext, command
from replset.wire.crud import collection_name, first_batch, run_write
from replset.wire.oplog_reader import OPLOG_NS
from replset.wire.ownership import sessions_of_users, sessions_to_end, set_share, share_parameters
from replset.wire.views import (
    check_not_view,
    create_timeseries,
    create_view,
    drop_timeseries,
    drop_view,
    modify_view,
    timeseries_of,
    view_entries,
)

if TYPE_CHECKING:
    from replset.node import Node


# -- handshake and diagnostics --------------------------------------------------------
@command("hello", "isMaster", "ismaster")
async def cmd_hello(ctx: CommandContext) -> dict[str, Any]:
    node, cmd = ctx.node, ctx.cmd
    if "client" in cmd and isinstance(cmd["client"], dict):
        ctx.conn.client_metadata = cmd["client"]
    topology, max_await = cmd.get("topologyVersion"), cmd.get("maxAwaitTimeMS")
    if (topology is None) != (max_await is None):
        raise MongoError(31368, "A request to wait for changes in topology must contain both "
                                "topologyVersion and maxAwaitTimeMS")
    if topology is not None:
        await _await_topology_change(ctx, topology, max_await)
    legacy = ctx.name != "hello"
    reply = build_hello(node.hello_view(ctx.conn.id), legacy=legacy, hello_ok=bool(cmd.get("helloOk")),
                        with_topology_version=True)
    if "saslSupportedMechs" in cmd or "speculativeAuthenticate" in cmd:
        reply.update(hello_auth_fields(ctx))
    return reply


async def _await_topology_change(ctx: CommandContext, topology: Any, max_await: Any) -> None:
    if not isinstance(topology, dict) or not isinstance(max_await, (int, float)) or max_await < 0:
        raise MongoError(14, "topologyVersion must be an object and maxAwaitTimeMS a non-negative number")
    node = ctx.node
    if topology.get("processId") != node.topology_process_id:
        return
    counter = int(topology.get("counter", 0))
    if counter > node.topology_counter:
        raise MongoError(51764, f"Received a topology version with counter {counter} which is greater "
                                f"than the server topology version counter {node.topology_counter}")
    if counter == node.topology_counter:
        await node.wait_for_state_change(counter, float(max_await) / 1000)


@command("ping")
async def cmd_ping(ctx: CommandContext) -> dict[str, Any]:
    return {"ok": 1.0}


def _version_array() -> list[int]:
    return [int(p) for p in __version__.split(".")] + [0]


@command("buildInfo", "buildinfo")
async def cmd_build_info(ctx: CommandContext) -> dict[str, Any]:
    return {
        "version": __version__, "gitVersion": "replset", "versionArray": _version_array(),
        "modules": [], "allocator": "system", "javascriptEngine": "none", "sysInfo": "deprecated",
        "bits": 64, "debug": False, "maxBsonObjectSize": MAX_BSON_OBJECT_SIZE,
        "storageEngines": ["sqlite"], "openssl": {"running": "disabled"}, "ok": 1.0,
    }


@command("getParameter")
async def cmd_get_parameter(ctx: CommandContext) -> dict[str, Any]:
    every = _server_parameters(ctx.node)
    if ctx.cmd.get("getParameter") == "*":
        return {**every, "ok": 1.0}
    wanted = [name for name in ctx.cmd if name not in _GENERIC_FIELDS and name != "getParameter"]
    reply: dict[str, Any] = {}
    for name in wanted:
        if name not in every:
            raise MongoError(72, "no option found to get")
        reply[name] = every[name]
    reply["ok"] = 1.0
    return reply


@command("fsync")
async def cmd_fsync(ctx: CommandContext) -> dict[str, Any]:
    """Makes every write committed so far durable (the WAL synced to disk) before it answers. `lock`
    (mongod's fsyncLock, which holds off every write until unlocked) is refused: 115."""
    if ctx.db != "admin":
        raise MongoError(13, "fsync may only be run against the admin database.")
    if ctx.cmd.get("lock"):
        raise MongoError(115, "fsync with lock is not supported by this server")
    await ctx.node.writer.submit(lambda txn: None, durable=True, flush=True)
    return {"numFiles": 1, "ok": 1.0}


@command("setParameter")
async def cmd_set_parameter(ctx: CommandContext) -> dict[str, Any]:
    """Sets the parameters this member lets change at run time: `transactionLifetimeLimitSeconds`
    (transactions started afterwards are aborted after that many seconds), `ttlMonitorSleepSecs` and
    `ttlMonitorEnabled` (the TTL monitor's period, and whether it runs)."""
    if ctx.db != "admin":
        raise MongoError(13, "setParameter may only be run against the admin database.")
    given = {k: v for k, v in ctx.cmd.items() if k not in _GENERIC_FIELDS and k != "setParameter"}
    if not given:
        raise MongoError(2, "no option found to set, use help:true to see options")
    reply: dict[str, Any] = {}
    node = ctx.node
    for name, value in given.items():
        was = set_share(node, name, value)  # (each owner's share of cursors, transactions, pins)
        if was is not None:
            reply["was"] = was
            continue
        if name not in _SETTABLE:
            raise MongoError(72, f"attempted to set unrecognized parameter [{name}], use help:true to see "
                                 "options")
        if name == "ttlMonitorEnabled":
            if not isinstance(value, bool):
                raise MongoError(14, "ttlMonitorEnabled must be a boolean")
            reply["was"], node.ttl.enabled = node.ttl.enabled, value
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
            raise MongoError(2, f"{name} must be a number of seconds, at least 1")
        if name == "transactionLifetimeLimitSeconds":
            reply["was"] = int(node.transactions.lifetime_limit_s)
            node.transactions.lifetime_limit_s = float(value)
        else:
            reply["was"] = int(node.ttl.sleep_s)
            node.ttl.sleep_s = float(value)
            node.ttl.settings_changed()
    reply["ok"] = 1.0
    return reply


_SETTABLE = frozenset({"transactionLifetimeLimitSeconds", "ttlMonitorSleepSecs", "ttlMonitorEnabled"})


def _server_parameters(node: Node) -> dict[str, Any]:
    """The parameters `getParameter` reports: the ones drivers' test suites look for."""
    return {
        "featureCompatibilityVersion": {"version": ".".join(__version__.split(".")[:2])},
        "enableTestCommands": node.options.enable_test_commands,
        "transactionLifetimeLimitSeconds": int(node.transactions.lifetime_limit_s),
        "ttlMonitorSleepSecs": int(node.ttl.sleep_s),
        "ttlMonitorEnabled": node.ttl.enabled,
        "requireApiVersion": False,
        **{name: shares.per_owner for name, shares in share_parameters(node).items()},
        "maxDecodedBlockBytes": node.options.max_decoded_block_bytes,   # --maxDecodedBlockBytes
    }


@command("getLog")
async def cmd_get_log(ctx: CommandContext) -> dict[str, Any]:
    """`*`: the logs there are; `global`: the recent structured lines (replset/structured_log.py);
    `startupWarnings`: none."""
    which = ctx.cmd.get("getLog")
    if which == "*":
        return {"names": ["global", "startupWarnings"], "ok": 1.0}
    if which == "global":
        return {"totalLinesWritten": RECENT.total, "log": list(RECENT.lines), "ok": 1.0}
    if which == "startupWarnings":
        return {"totalLinesWritten": 0, "log": [], "ok": 1.0}
    raise MongoError(2, f"No log named '{which}'")


@command("serverStatus")
async def cmd_server_status(ctx: CommandContext) -> dict[str, Any]:
    node = ctx.node
    uptime = node.uptime_s()
    return {
        "host": f"{socket.gethostname()}:{node.options.port}", "version": __version__,
        "process": "replset", "pid": Int64(node.pid()), "uptime": float(int(uptime)),
        "uptimeMillis": Int64(int(uptime * 1000)), "uptimeEstimate": Int64(int(uptime)),
        "localTime": node.now(),
        "connections": {"current": node.connections_open, "totalCreated": node.connections_created},
        "repl": build_hello(node.hello_view(ctx.conn.id), legacy=False, hello_ok=False,
                            with_topology_version=False),
        "storageEngine": {"name": "sqlite", "persistent": True},
        "groupCommit": {"batches": Int64(node.writer.batches), "requests": Int64(node.writer.requests)},
        "metrics": {"cursor": {"open": {"total": Int64(len(node.cursors))}}},
        "ok": 1.0,
    }


@command("hostInfo")
async def cmd_host_info(ctx: CommandContext) -> dict[str, Any]:
    return {"system": {"hostname": socket.gethostname(), "cpuArch": platform.machine()},
            "os": {"type": platform.system(), "name": platform.platform()}, "extra": {}, "ok": 1.0}


@command("whatsmyuri")
async def cmd_whatsmyuri(ctx: CommandContext) -> dict[str, Any]:
    return {"you": ctx.conn.peer, "ok": 1.0}


@command("getCmdLineOpts")
async def cmd_get_cmd_line_opts(ctx: CommandContext) -> dict[str, Any]:
    opts = ctx.node.options
    net: dict[str, Any] = {"port": opts.port, **({"bindIpAll": True} if opts.listen_hosts is None
                                                 else {"bindIp": opts.bind_ip})}
    if opts.tls.on:
        net["tls"] = {"mode": opts.tls.mode}
    security = {"authorization": "enabled"} if opts.auth else {}
    if opts.key_file:
        security["keyFile"] = opts.key_file
    return {"argv": ["replset", "node"], "parsed": {"net": net, **({"security": security} if security else {}),
            "replication": {"replSet": opts.repl_set, "oplogSizeMB": opts.oplog_size_mb},
            "storage": {"dbPath": opts.dbpath,
                        **({"partsStorage": redact_url(opts.parts_storage)} if opts.parts_storage else {})}},
            "ok": 1.0}


@command("endSessions", "killSessions", "refreshSessions", "startSession", "killAllSessions")
async def cmd_sessions(ctx: CommandContext) -> dict[str, Any]:
    if ctx.name == "startSession":
        return {"id": {"id": Binary(uuid.uuid4().bytes, 4)}, "timeoutMinutes": 30, "ok": 1.0}
    if ctx.name == "killAllSessions":
        named = sessions_of_users(ctx)
        if named is None:
            ctx.node.transactions.abort_all(f"the sessions were killed ({ctx.name})")
        else:
            ctx.node.transactions.end_sessions(named, f"its session was killed ({ctx.name})")
    elif ctx.name in ("endSessions", "killSessions"):
        ids = sessions_to_end(ctx)  # (the caller's own: others' are left alone)
        ctx.node.transactions.end_sessions(ids, f"its session ended ({ctx.name})")
        ctx.node.local_sessions.ended(ids)
    return {"ok": 1.0}


# -- catalog --------------------------------------------------------------------------
@command("listDatabases", kind="read")
async def cmd_list_databases(ctx: CommandContext) -> dict[str, Any]:
    store = ctx.node.store

    def database_sizes() -> dict[str, int]:  # sums every document's size: on the query pool
        reader = store.thread_reader()
        sizes: dict[str, int] = {"local": 0}
        for info in reader.collections():
            sizes[info.db] = sizes.get(info.db, 0) + reader.data_size(info.ns)
        return sizes

    sizes = await ctx.node.queries.run(database_sizes)
    matcher = compile_filter(ctx.cmd.get("filter") or {})
    dbs = [{"name": n, "sizeOnDisk": Int64(s), "empty": s == 0} for n, s in sorted(sizes.items())]
    dbs = [d for d in dbs if matcher.matches(d)]
    if ctx.node.options.auth:
        shown = set(visible_databases(ctx.node.store.reader, ctx.conn.auth, [d["name"] for d in dbs],
                                      cache=ctx.node.user_grants))
        dbs = [d for d in dbs if d["name"] in shown]
    if ctx.cmd.get("nameOnly"):
        return {"databases": [{"name": d["name"]} for d in dbs], "ok": 1.0}
    total = sum(int(d["sizeOnDisk"]) for d in dbs)
    return {"databases": dbs, "totalSize": Int64(total), "totalSizeMb": Int64(total // (1024 * 1024)), "ok": 1.0}


def _collection_entries(ctx: CommandContext) -> list[dict[str, Any]]:
    entries = []
    for info in ctx.node.store.reader.collections(ctx.db):
        entry = {"name": info.name, "type": "collection", "options": info.options,
                 "info": {"readOnly": False, "uuid": info.uuid}}
        if not is_clustered(info.options):  # (a clustered collection's _id index is the collection)
            entry["idIndex"] = {"v": 2, "key": {"_id": 1}, "name": "_id_"}
        entries.append(entry)
    entries.extend(view_entries(ctx.node.store.reader, ctx.db))
    if ctx.db == "local":
        entries.append({"name": "oplog.rs", "type": "collection",
                        "options": {"capped": True, "size": ctx.node.options.oplog_size_mb * 1024 * 1024},
                        "info": {"readOnly": False}})
        entries.sort(key=lambda e: e["name"])
    return entries


def _cursor_batch_size(cmd: dict[str, Any]) -> int | None:
    size = (cmd.get("cursor") or {}).get("batchSize")
    return None if size is None else int(size)


@command("listCollections", kind="read")
async def cmd_list_collections(ctx: CommandContext) -> dict[str, Any]:
    query = ctx.cmd.get("filter") or {}
    matcher = compile_filter(query)
    entries = [e for e in _collection_entries(ctx) if matcher.matches(e)]
    if ctx.cmd.get("nameOnly"):
        entries = [{"name": e["name"], "type": e["type"]} for e in entries]
    cursor = Cursor(id=0, ns=f"{ctx.db}.$cmd.listCollections", source=iter(entries))
    return await first_batch(ctx, cursor, _cursor_batch_size(ctx.cmd), False)


@command("listIndexes", kind="read")
async def cmd_list_indexes(ctx: CommandContext) -> dict[str, Any]:
    ns = f"{ctx.db}.{collection_name(ctx)}"
    reader = ctx.node.store.reader
    if reader.collection(ns) is None:
        raise MongoError(26, f"ns does not exist: {ns}")
    specs = [i.spec for i in reader.indexes(ns)]
    options = reader.collection(ns).options
    if is_clustered(options):  # (its _id index is the clustered one)
        specs = [clustered_index_spec(options) if spec["name"] == "_id_" else spec for spec in specs]
    cursor = Cursor(id=0, ns=ns, source=iter(specs))
    return await first_batch(ctx, cursor, _cursor_batch_size(ctx.cmd), False)


def coll_stats_document(ctx: CommandContext, ns: str, spec: Any, reader: Any) -> dict[str, Any]:
    """`$collStats` storage figures. Counts and sums every document: call it on the query pool, with
    that thread's reader."""
    if ns == OPLOG_NS:
        size, count = ctx.node.oplog_size_bytes(), ctx.node.oplog_count()
        max_size = ctx.node.options.oplog_size_mb * 1024 * 1024
    else:
        info = reader.collection(ns)
        limits = None if info is None else capped_limits(info.options)
        size, count = reader.data_size(ns), reader.count(ns)
        max_size = 0 if limits is None else limits.size
    storage: dict[str, Any] = {"size": Int64(size), "count": Int64(count), "storageSize": Int64(size),
                               "nindexes": len(reader.indexes(ns)) if ns != OPLOG_NS else 0,
                               "capped": bool(max_size)}
    if max_size:
        storage.update(maxSize=Int64(max_size))
        if ns != OPLOG_NS and limits is not None and limits.max_docs:
            storage["max"] = Int64(limits.max_docs)
    return {"ns": ns, "host": ctx.node.options.me, "localTime": ctx.node.now(),
            "storageStats": storage}


# -- DDL ---------------------------------------------------------------------------------
@command("create", kind="write")
async def cmd_create(ctx: CommandContext) -> dict[str, Any]:
    coll = collection_name(ctx)
    validate_namespace(ctx.db, coll)
    ns = f"{ctx.db}.{coll}"
    system_namespaces.check_write(ns)
    options = {k: v for k, v in ctx.cmd.items() if k not in _GENERIC_FIELDS and k != "create"}
    if "viewOn" in options or "pipeline" in options:
        return await run_write(ctx, lambda env: create_view(env, ctx.db, coll, options))
    if "timeseries" in options:
        return await run_write(ctx, lambda env: create_timeseries(env, ctx.db, coll, options))
    unsupported = sorted(set(options) - _CREATE_OPTIONS)
    if unsupported:
        raise MongoError(115, f"create option(s) {', '.join(unsupported)} not supported by this server")
    _check_validation_options(options, ctx.node.now())
    options = check_clustered_options(check_capped_options(options))

    def body(env: WriteEnv) -> dict[str, Any]:
        if env.txn.collection(ns) is not None or view_definition(env.txn, ns) is not None:
            raise MongoError(48, f"Collection {ns} already exists.")
        env.emit(command_entry(ctx.db, {"create": coll, **options}, new_collection_uuid()))
        return {"ok": 1.0}

    return await run_write(ctx, body)


@command("drop", kind="write")
async def cmd_drop(ctx: CommandContext) -> dict[str, Any]:
    coll = collection_name(ctx)
    ns = f"{ctx.db}.{coll}"
    system_namespaces.check_drop(ns)

    def body(env: WriteEnv) -> dict[str, Any]:
        info = env.txn.collection(ns)
        if info is None and timeseries_of(env.txn, ns) is not None:
            ctx.node.buckets.forget(f"{ctx.db}.{buckets_name(coll)}")
            return drop_timeseries(env, ctx.db, coll)
        if info is None and view_definition(env.txn, ns) is not None:
            return drop_view(env, ctx.db, coll)
        if info is None:
            raise MongoError(26, "ns not found")
        n_indexes = len(env.txn.indexes(ns))
        env.emit(command_entry(ctx.db, {"drop": coll}, info.uuid))
        return {"nIndexesWas": n_indexes, "ns": ns, "ok": 1.0}

    return await run_write(ctx, body, off_loop=True)  # freeing the table's pages takes a while


@command("dropDatabase", kind="write")
async def cmd_drop_database(ctx: CommandContext) -> dict[str, Any]:
    system_namespaces.check_drop_database(ctx.db)

    def body(env: WriteEnv) -> dict[str, Any]:
        collections = env.txn.collections(ctx.db)
        if collections:
            # As mongod 4.2+ logs it: a drop of each collection, then the database's own entry (change
            # streams report a `drop` event for each, then `dropDatabase`).
            for info in collections:
                env.emit(command_entry(ctx.db, {"drop": info.name}, info.uuid))
            env.emit(command_entry(ctx.db, {"dropDatabase": 1}))
        return {"dropped": ctx.db, "ok": 1.0}

    return await run_write(ctx, body, off_loop=True)


def _validate_index_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict) or not isinstance(spec.get("key"), dict) or not spec["key"]:
        raise MongoError(9, "index specification must have a non-empty 'key' object")
    if not isinstance(spec.get("name"), str) or not spec["name"]:
        raise MongoError(9, "index specification must have a 'name' string")
    for field, direction in spec["key"].items():
        if not (isinstance(direction, (int, float)) and direction != 0) and direction not in (
                "text", "2dsphere", "2d", "hashed"):
            raise MongoError(67, f"Values in the index key pattern can't be 0 or invalid: {field}")
    out = {"v": 2, "key": spec["key"], "name": spec["name"]}
    # (`dropDups` went in MongoDB 3.0; mongod still takes it and ignores it)
    out.update({k: v for k, v in spec.items() if k not in ("key", "name", "v", "ns", "dropDups")})
    if out.get("unique") is False:
        del out["unique"]
    unsupported = sorted(set(out) - _INDEX_OPTIONS)
    if unsupported:
        raise MongoError(67, f"index option(s) {', '.join(unsupported)} not supported by this server")
    kinds = sorted({str(d) for d in spec["key"].values() if isinstance(d, str) and d != "hashed"})
    if kinds:
        raise MongoError(67, f"{', '.join(kinds)} indexes are not supported by this server")
    check_ttl_spec(out)
    if "partialFilterExpression" in out:
        _check_partial_filter(out["partialFilterExpression"])
    return out


def _check_partial_filter(expression: Any) -> None:
    """A partial index's filter is a query document (14 otherwise); a bad operator in it is refused as a
    query's is."""
    if not isinstance(expression, dict):
        raise MongoError(14, "partialFilterExpression must be an object")
    compile_filter(expression)


# Index options this member honours (`background` and `storageEngine` change nothing observable).
_INDEX_OPTIONS = frozenset({"v", "key", "name", "unique", "sparse", "partialFilterExpression",
                            "expireAfterSeconds", "background", "collation", "storageEngine"})


@command("createIndexes", kind="write")
async def cmd_create_indexes(ctx: CommandContext) -> dict[str, Any]:
    coll = collection_name(ctx)
    ns = f"{ctx.db}.{coll}"
    system_namespaces.check_write(ns)
    check_not_view(ctx.node.store.reader, ns, "createIndexes")
    raw = ctx.cmd.get("indexes")
    if not isinstance(raw, list) or not raw:
        raise MongoError(2, "Must specify at least one index to create")
    specs = [_validate_index_spec(s) for s in raw]

    def body(env: WriteEnv) -> dict[str, Any]:
        created_collection = env.txn.collection(ns) is None
        ensure_collection(env, ns)
        existing = {i.name: i.spec for i in env.txn.indexes(ns)}
        before = len(existing)
        for spec in specs:
            if _index_exists(existing, spec):
                continue
            env.emit(command_entry(ctx.db, {"createIndexes": coll, **spec}, env.txn.collection(ns).uuid))
            existing[spec["name"]] = spec
        reply: dict[str, Any] = {"numIndexesBefore": before, "numIndexesAfter": len(existing),
                                 "createdCollectionAutomatically": created_collection,
                                 "commitQuorum": "votingMembers"}
        if len(existing) == before:
            reply["note"] = "all indexes already exist"
        reply["ok"] = 1.0
        return reply

    # A unique index reads every document for its keys: built on a worker thread.
    return await run_write(ctx, body, off_loop=any(spec.get("unique") for spec in specs))


def _index_exists(existing: dict[str, dict[str, Any]], spec: dict[str, Any]) -> bool:
    same_name = existing.get(spec["name"])
    if same_name is not None:
        if same_name["key"] != spec["key"]:
            raise MongoError(86, f"An existing index has the same name as the requested index. "
                                 f"Requested index: {spec}, existing index: {same_name}")
        if bool(same_name.get("unique")) != bool(spec.get("unique")):
            raise MongoError(85, f"An existing index has the same name as the requested index but "
                                 f"different options: {spec['name']}")
        return True
    for other in existing.values():
        if other["key"] == spec["key"] and bool(other.get("unique")) == bool(spec.get("unique")):
            raise MongoError(85, f"Index already exists with a different name: {other['name']}")
    return False


@command("collMod", kind="write")
async def cmd_coll_mod(ctx: CommandContext) -> dict[str, Any]:
    """Changes a TTL index's `expireAfterSeconds` and the collection's `validator`,
    `validationLevel`, `validationAction` and `changeStreamPreAndPostImages` (logged, so every
    member changes them); a bare `collMod` changes nothing (it is logged too: change streams show it
    as `modify`); of a view, its `viewOn` and `pipeline`. Every other option is refused (115)."""
    coll = collection_name(ctx)
    ns = f"{ctx.db}.{coll}"
    system_namespaces.check_write(ns)
    options = {k: v for k, v in ctx.cmd.items() if k not in _GENERIC_FIELDS and k != "collMod"}
    if timeseries_of(ctx.node.store.reader, ns) is not None:
        raise MongoError(72, f"collMod of the time-series collection {ns} is not supported by this server")
    if view_definition(ctx.node.store.reader, ns) is not None:
        return await run_write(ctx, lambda env: modify_view(env, ctx.db, coll, options))
    unsupported = sorted(set(options) - {"index", *COLLMOD_OPTIONS})
    if unsupported:
        raise MongoError(115, f"collMod option(s) {', '.join(unsupported)} not supported by this server")
    _check_validation_options(options, ctx.node.now())
    validation = {k: v for k, v in options.items() if k in COLLMOD_OPTIONS}
    index = options.get("index")
    if index is not None and (not isinstance(index, dict) or set(index) - {"name", "keyPattern",
                                                                           "expireAfterSeconds"}):
        raise MongoError(115, "collMod of an index can only change 'expireAfterSeconds' here")

    def body(env: WriteEnv) -> dict[str, Any]:
        info = env.txn.collection(ns)
        if info is None:
            raise MongoError(26, f"ns does not exist: {ns}")
        if index is None or validation:
            env.emit(command_entry(ctx.db, {"collMod": coll, **validation}, info.uuid))
        if index is None:
            return {"ok": 1.0}
        found = next((i for i in env.txn.indexes(ns) if i.name == index.get("name")
                      or ("keyPattern" in index and i.spec["key"] == index["keyPattern"])), None)
        if found is None:
            raise MongoError(27, f"cannot find index {index.get('name', index.get('keyPattern'))} for ns {ns}")
        if "expireAfterSeconds" not in found.spec:
            raise MongoError(72, "no expireAfterSeconds field to update: the index is not a TTL index")
        if "expireAfterSeconds" not in index:
            return {"ok": 1.0}
        check_ttl_spec({"key": found.spec["key"], "expireAfterSeconds": index["expireAfterSeconds"]})
        env.emit(command_entry(ctx.db, {"collMod": coll, "index": {
            "name": found.name, "expireAfterSeconds": index["expireAfterSeconds"]}}, info.uuid))
        return {"expireAfterSeconds_old": found.spec["expireAfterSeconds"],
                "expireAfterSeconds_new": index["expireAfterSeconds"], "ok": 1.0}

    return await run_write(ctx, body)


@command("dropIndexes", "deleteIndexes", kind="write")
async def cmd_drop_indexes(ctx: CommandContext) -> dict[str, Any]:
    coll = collection_name(ctx)
    ns = f"{ctx.db}.{coll}"
    system_namespaces.check_write(ns)
    target = ctx.cmd.get("index")

    def body(env: WriteEnv) -> dict[str, Any]:
        info = env.txn.collection(ns)
        if info is None:
            raise MongoError(26, f"ns not found {ns}")
        indexes = env.txn.indexes(ns)
        names = _indexes_to_drop(indexes, target)
        for name in names:
            env.emit(command_entry(ctx.db, {"dropIndexes": coll, "index": name}, info.uuid))
        return {"nIndexesWas": len(indexes), "ok": 1.0}

    return await run_write(ctx, body)


@command("renameCollection", kind="write")
async def cmd_rename_collection(ctx: CommandContext) -> dict[str, Any]:
    """`{renameCollection: "db.from", to: "db.to", dropTarget?}`, run against `admin`, within one
    database (renaming across databases copies data in mongod; not supported here)."""
    if ctx.db != "admin":
        raise MongoError(13, "renameCollection may only be run against the admin database.")
    source, target = ctx.cmd.get("renameCollection"), ctx.cmd.get("to")
    if not isinstance(source, str) or not isinstance(target, str):
        raise MongoError(14, "'renameCollection' and 'to' must be namespace strings")
    for ns in (source, target):
        db, _, coll = ns.partition(".")
        validate_namespace(db, coll)
    system_namespaces.check_rename(source, target)
    if source.partition(".")[0] != target.partition(".")[0]:
        raise MongoError(115, "renaming a collection across databases is not supported")
    if source == target:
        raise MongoError(20, "Can't rename a collection to itself")
    for ns in (source, target):
        check_not_view(ctx.node.store.reader, ns, "renameCollection")
    drop_target = bool(ctx.cmd.get("dropTarget"))
    db = source.partition(".")[0]

    def body(env: WriteEnv) -> dict[str, Any]:
        info = env.txn.collection(source)
        if info is None:
            raise MongoError(26, f"Source collection {source} does not exist")
        if env.txn.collection(target) is not None and not drop_target:
            raise MongoError(48, "target namespace exists")
        env.emit(command_entry(db, {"renameCollection": source, "to": target, "dropTarget": drop_target},
                               info.uuid))
        return {"ok": 1.0}

    return await run_write(ctx, body)


def _indexes_to_drop(indexes: list[Any], target: Any) -> list[str]:
    if target == "*":
        return [i.name for i in indexes if i.name != "_id_"]
    targets = target if isinstance(target, list) else [target]
    names = []
    for t in targets:
        match = next((i for i in indexes if (i.name == t if isinstance(t, str) else i.spec["key"] == t)), None)
        if match is None:
            raise MongoError(27, f"index not found with name [{t}]")
        if match.name == "_id_":
            raise MongoError(72, "cannot drop _id index")
        names.append(match.name)
    return names


# -- replica set ---------------------------------------------------------------------------
@command("replSetInitiate")
async def cmd_repl_set_initiate(ctx: CommandContext) -> dict[str, Any]:
    raw = ctx.cmd.get("replSetInitiate")
    await ctx.node.initiate(raw if isinstance(raw, dict) else None)
    return {"ok": 1.0}


@command("replSetGetConfig")
async def cmd_repl_set_get_config(ctx: CommandContext) -> dict[str, Any]:
    if ctx.node.config is None:
        raise MongoError(94, "no replset config has been received")
    return {"config": ctx.node.config.to_document(), "ok": 1.0}


@command("replSetGetStatus")
async def cmd_repl_set_get_status(ctx: CommandContext) -> dict[str, Any]:
    if ctx.node.config is None:
        raise MongoError(94, "no replset config has been received")
    return replset_status(ctx.node.status_view()) | {"ok": 1.0}


# The options `create` takes: the validation and pre-image options it acts on, and the others because
# they change nothing a client can observe here.
_CREATE_OPTIONS = frozenset({"idIndex", "storageEngine", "indexOptionDefaults", "collation", "autoIndexId",
                             "validator", "validationLevel", "validationAction", "changeStreamPreAndPostImages",
                             "capped", "size", "max", "clusteredIndex", "expireAfterSeconds"})


def _check_validation_options(options: dict[str, Any], now: datetime.datetime) -> None:
    """A validator compiles as a query filter (with `$jsonSchema`); the level and action are mongod's."""
    if "validator" in options:
        if not isinstance(options["validator"], dict):
            raise MongoError(14, "'validator' must be an object")
        compile_filter(options["validator"], now=now)
    if "changeStreamPreAndPostImages" in options:
        setting = options["changeStreamPreAndPostImages"]
        if not isinstance(setting, dict) or set(setting) != {"enabled"} or not isinstance(setting["enabled"], bool):
            raise MongoError(2, "changeStreamPreAndPostImages must be {enabled: <bool>}")
    if options.get("validationLevel", "strict") not in ("off", "strict", "moderate"):
        raise MongoError(2, f"Enumeration value '{options['validationLevel']}' for field 'validationLevel' is not a "
                            "valid value.")
    if options.get("validationAction", "error") not in ("error", "warn"):
        raise MongoError(2, f"Enumeration value '{options['validationAction']}' for field 'validationAction' is "
                            "not a valid value.")


_GENERIC_FIELDS = frozenset({
    "$db", "lsid", "txnNumber", "$clusterTime", "$readPreference", "readConcern", "writeConcern",
    "maxTimeMS", "comment", "apiVersion", "apiStrict", "apiDeprecationErrors", "autocommit",
    "startTransaction", "stmtId", "$audit", "$client", "mayBypassWriteBlocking",
})
