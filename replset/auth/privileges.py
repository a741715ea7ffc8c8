"""What a command needs: the (action, resource) pairs computed from every namespace it reads or
writes, and the one check every wire command and HTTP route passes. Pure: no I/O.

Theory of operation. mongod checks a command against what it touches, never against `$db` alone:
an aggregate on `A` whose `$out` names `B.c` needs `insert` and `remove` on `B.c`; its `$lookup`,
`$graphLookup` and `$unionWith` stages need `find` on their sources, nested pipelines included; a
rename needs actions on both sides (the source and the target may be in other databases than the
`admin` it is sent to); a cluster-wide change stream needs `changeStream` and `find` on every
database; `createUser` and `grantRolesToUser` need `grantRole` on each granted role's database.

`required` walks the command and lists every pair; `authorize` refuses (Unauthorized, 13) unless
the user's grants (replset/auth/roles.py) allow each. A field this walk cannot read (a malformed
`$out`, a rename target that is not a string) fails closed: it needs the action on every database,
so only a cluster-wide administrator gets as far as the argument check that refuses it with its own
code. `COMMAND_ACTIONS` names every command the member serves; a command missing from it is refused
to all but members (tests/unit/test_privileges.py holds the table to the dispatch table).
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from base.errors import MongoError
from replset.auth.roles import (
    ALL_DATABASES,
    CLUSTER,
    INTERNAL,
    Grant,
    Kind,
    Resource,
    database,
    holds,
    namespace,
)

UNAUTHORIZED = 13
Need = tuple[str, Resource]  # an action on a resource

NO_AUTH = frozenset({
    "hello", "isMaster", "ismaster", "ping", "buildInfo", "buildinfo", "saslStart", "saslContinue",
    "authenticate", "logout", "getnonce", "connectionStatus", "whatsmyuri",
})
# Only a user: what they act on is their own (sessions, cursors and transactions are checked against
# their owner where they are used), or the reply holds only what they may see (listDatabases).
AUTHENTICATED = frozenset({
    "startSession", "refreshSessions", "endSessions", "killSessions", "getMore", "killCursors",
    "commitTransaction", "abortTransaction", "listDatabases",
})

# command -> (actions on the collection it names): the commands whose needs are those actions on
# `<$db>.<the command's value>`.
_ON_COLLECTION: dict[str, frozenset[str]] = {
    "find": frozenset({"find"}), "count": frozenset({"find"}), "distinct": frozenset({"find"}),
    "delete": frozenset({"remove"}),
    "drop": frozenset({"dropCollection"}), "createIndexes": frozenset({"createIndex"}),
    "dropIndexes": frozenset({"dropIndex"}), "deleteIndexes": frozenset({"dropIndex"}),
    "listIndexes": frozenset({"listIndexes"}), "validate": frozenset({"validate"}),
    # parts tables: reads are finds, inserts inserts, ALTER DELETE and DROP PARTITION removes (as ClickHouse's
    # ALTER DELETE privilege covers DROP PARTITION), ALTER UPDATE and KILL MUTATION updates, ALTER collMod
    "selectParts": frozenset({"find"}), "partsStatus": frozenset({"find"}), "partsMutations": frozenset({"find"}),
    "partsJobStatus": frozenset({"find"}), "openPartsSnapshot": frozenset({"find"}),
    "insertBlock": frozenset({"insert"}), "insertStatus": frozenset({"insert"}),
    "stagePartsBlock": frozenset({"insert"}), "commitPartsJob": frozenset({"insert"}),
    "abortPartsJob": frozenset({"insert"}),
    "alterDelete": frozenset({"remove"}), "dropPartition": frozenset({"remove"}),
    "alterUpdate": frozenset({"update"}), "killPartsMutation": frozenset({"update"}),
    "alterPartsTable": frozenset({"collMod"}),
    "createPartsTable": frozenset({"createCollection"}), "dropPartsTable": frozenset({"dropCollection"}),
}
_ON_DATABASE: dict[str, frozenset[str]] = {
    "listCollections": frozenset({"listCollections"}), "dropDatabase": frozenset({"dropDatabase"}),
}
_ON_CLUSTER: dict[str, str] = {
    "replSetGetStatus": "replSetGetStatus", "replSetGetConfig": "replSetGetConfig",
    "serverStatus": "serverStatus", "hostInfo": "hostInfo", "getLog": "getLog",
    "getCmdLineOpts": "getCmdLineOpts", "getParameter": "getParameter",
    "partsReplicationQueue": "replSetGetStatus",
    "replSetReconfig": "replSetConfigure", "replSetInitiate": "replSetConfigure",
    "replSetStepDown": "replSetStateChange", "replSetFreeze": "replSetStateChange",
    "replSetStepUp": "replSetStateChange", "replSetSyncFrom": "replSetStateChange",
    "resync": "resync", "setParameter": "setParameter", "fsync": "fsync", "shutdown": "shutdown",
    "killAllSessions": "killAnySession", "configureFailPoint": "configureFailPoint",
    "replSetHeartbeat": INTERNAL, "replSetRequestVotes": INTERNAL, "replSetUpdatePosition": INTERNAL,
    "replSetGetRBID": INTERNAL, "_partsCommit": INTERNAL, "_partsStage": INTERNAL, "_aggregateOutput": INTERNAL,
}
_COMPUTED = frozenset({"aggregate", "explain", "insert", "update", "findAndModify", "findandmodify", "splitVector",
                       "create", "collMod",
                       "renameCollection", "createUser", "updateUser", "dropUser", "grantRolesToUser",
                       "revokeRolesFromUser", "usersInfo"})
COMMAND_ACTIONS = frozenset(NO_AUTH | AUTHENTICATED | set(_ON_COLLECTION) | set(_ON_DATABASE) | set(_ON_CLUSTER)
                            | _COMPUTED)

_SUB_PIPELINE_STAGES = ("$lookup", "$unionWith", "$graphLookup", "$facet")


def _collection(db: str, value: Any) -> Resource:
    """The namespace a command's value names; the database itself for `1` or anything not a name."""
    return namespace(db, value) if isinstance(value, str) and value else database(db)


def _full_name(value: Any) -> Resource:
    """A `<db>.<collection>` (renameCollection's sides); every database when it is not one."""
    if isinstance(value, str):
        db, dot, coll = value.partition(".")
        if db and dot and coll:
            return namespace(db, coll)
    return ALL_DATABASES


def _target(db: str, value: Any) -> Resource:
    """`$out`'s and `$merge`'s target: a name in this database, or `{db, coll}`."""
    if isinstance(value, str) and value:
        return namespace(db, value)
    if isinstance(value, Mapping):
        target_db, coll = value.get("db", db), value.get("coll")
        if isinstance(target_db, str) and target_db and isinstance(coll, str) and coll:
            return namespace(target_db, coll)
    return ALL_DATABASES


def _source(db: str, value: Any) -> Resource:
    """A `$lookup`/`$graphLookup`/`$unionWith` source: a name in this database or `{db, coll}`."""
    return _target(db, value)


_MALFORMED = "?"   # a stage of other than one key: what it touches cannot be told, so it fails closed


def _stages(pipeline: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(pipeline, list):
        for stage in pipeline:
            if isinstance(stage, Mapping) and len(stage) == 1:
                yield next(iter(stage.items()))
            else:
                yield _MALFORMED, stage


def pipeline_needs(db: str, pipeline: Any, cmd: Mapping[str, Any],
                   me: Iterable[tuple[str, str]] = ()) -> Iterator[Need]:
    """What a pipeline's stages read and write beyond its source, nested pipelines included; `me` are
    the connection's users (listing one's own sessions needs nothing)."""
    bypass = bool(cmd.get("bypassDocumentValidation"))
    for name, spec in _stages(pipeline):
        match name:
            case "?":   # (`_MALFORMED`: its handler might read any of its keys)
                yield INTERNAL, CLUSTER
            case "$out":
                target = _target(db, spec)
                yield from (("insert", target), ("remove", target))
                if bypass:
                    yield "bypassDocumentValidation", target
            case "$merge":
                target = _target(db, spec.get("into") if isinstance(spec, Mapping) else spec)
                yield from (("insert", target), ("update", target))
                if bypass:
                    yield "bypassDocumentValidation", target
            case "$lookup" | "$graphLookup":
                if isinstance(spec, Mapping):
                    if "from" in spec:
                        yield "find", _source(db, spec["from"])
                    yield from pipeline_needs(db, spec.get("pipeline"), cmd, me)
            case "$unionWith":
                coll = spec.get("coll") if isinstance(spec, Mapping) else spec
                if coll is not None:
                    yield "find", _source(db, coll)
                if isinstance(spec, Mapping):
                    yield from pipeline_needs(db, spec.get("pipeline"), cmd, me)
            case "$facet":
                for branch in (spec.values() if isinstance(spec, Mapping) else ()):
                    yield from pipeline_needs(db, branch, cmd, me)
            case "$currentOp":
                if isinstance(spec, Mapping) and spec.get("allUsers") is True:
                    yield "inprog", CLUSTER
            case "$listLocalSessions" | "$listSessions":
                if isinstance(spec, Mapping) and (spec.get("allUsers") is True or not _only(spec.get("users"), me)):
                    yield "listSessions", CLUSTER


def _only(users: Any, me: Iterable[tuple[str, str]]) -> bool:
    """Whether a `users` list (absent: the caller's own) names the connection's users and nobody else."""
    if users is None:
        return True
    mine = set(me)
    return isinstance(users, list) and all(
        isinstance(u, Mapping) and (u.get("user"), u.get("db")) in mine for u in users)


def _aggregate(db: str, cmd: Mapping[str, Any], me: Iterable[tuple[str, str]]) -> Iterator[Need]:
    pipeline = cmd.get("pipeline")
    source = _collection(db, cmd.get("aggregate"))
    first, spec = next(_stages(pipeline), ("", None))
    match first:
        case "$changeStream":
            if isinstance(spec, Mapping) and spec.get("allChangesForCluster") is True:
                source = ALL_DATABASES
            yield from (("changeStream", source), ("find", source))
        case "$collStats" | "$indexStats" | "$planCacheStats":
            yield {"$collStats": "collStats", "$indexStats": "indexStats",
                   "$planCacheStats": "planCacheRead"}[first], source
        case "$documents" | "$currentOp" | "$listLocalSessions" | "$listSessions" if source.kind is Kind.DATABASE:
            pass  # `aggregate: 1`: reads no collection (what they list is checked below)
        case _:
            yield "find", source   # (a named collection is read, whatever the first stage: explain scans it)
    yield from pipeline_needs(db, pipeline, cmd, me)


def _writes(db: str, name: str, cmd: Mapping[str, Any]) -> Iterator[Need]:
    target = _collection(db, cmd.get(name))
    if name == "insert":
        yield "insert", target
    elif name == "update":
        yield "update", target
        statements = cmd.get("updates")
        if isinstance(statements, list) and any(isinstance(s, Mapping) and s.get("upsert") for s in statements):
            yield "insert", target
    else:  # findAndModify
        yield "find", target
        yield ("remove" if cmd.get("remove") else "update"), target
        if cmd.get("upsert"):
            yield "insert", target
    if cmd.get("bypassDocumentValidation"):
        yield "bypassDocumentValidation", target


def _view_sources(db: str, cmd: Mapping[str, Any]) -> Iterator[Need]:
    """A view's definition reads its source and every namespace of its pipeline."""
    if "viewOn" in cmd:
        yield "find", _source(db, cmd["viewOn"])
        yield from pipeline_needs(db, cmd.get("pipeline"), cmd)


def _rename(cmd: Mapping[str, Any]) -> Iterator[Need]:
    """mongod's rules: within one database `renameCollectionSameDB` there (on both names); across
    databases, reading and dropping the source, creating and filling the target; `dropTarget` drops it."""
    source, target = _full_name(cmd.get("renameCollection")), _full_name(cmd.get("to"))
    if source.kind is Kind.NAMESPACE and target.kind is Kind.NAMESPACE and source.db == target.db:
        yield from (("renameCollectionSameDB", source), ("renameCollectionSameDB", target))
    else:
        yield from (("find", source), ("dropCollection", source))
        yield from (("insert", target), ("createIndex", target), ("createCollection", target))
    if cmd.get("dropTarget"):
        yield "dropCollection", target


def _role_dbs(db: str, roles: Any) -> Iterator[str]:
    """The databases of the roles a user command names (a bare name is a role of `db`)."""
    for role in roles if isinstance(roles, list) else []:
        if isinstance(role, str):
            yield db
        elif isinstance(role, Mapping):
            role_db = role.get("db")
            yield role_db if isinstance(role_db, str) else ""


def _named_users(db: str, spec: Any) -> list[tuple[str, str]] | None:
    """The users `usersInfo` names ((user, db) pairs); None for all of a database's or a malformed spec."""
    items = spec if isinstance(spec, list) else [spec]
    out = []
    for item in items:
        if isinstance(item, str):
            out.append((item, db))
        elif isinstance(item, Mapping) and isinstance(item.get("user"), str) and isinstance(item.get("db", db), str):
            out.append((item["user"], item.get("db", db)))
        else:
            return None
    return out


def _user_commands(name: str, db: str, cmd: Mapping[str, Any],
                   me: Iterable[tuple[str, str]]) -> Iterator[Need]:
    here = database(db)
    match name:
        case "createUser":
            yield "createUser", here
            yield from (("grantRole", database(d)) for d in _role_dbs(db, cmd.get("roles")))
        case "updateUser":
            if "pwd" in cmd:
                yield "changePassword", here
            if "customData" in cmd:
                yield "changeCustomData", here
            if "roles" in cmd:
                yield "revokeRole", here
                yield from (("grantRole", database(d)) for d in _role_dbs(db, cmd.get("roles")))
            if "pwd" not in cmd and "customData" not in cmd and "roles" not in cmd:
                yield "changePassword", here
        case "dropUser":
            yield "dropUser", here
        case "grantRolesToUser":
            yield from (("grantRole", database(d)) for d in _role_dbs(db, cmd.get("roles")))
        case "revokeRolesFromUser":
            yield from (("revokeRole", database(d)) for d in _role_dbs(db, cmd.get("roles")))
        case "usersInfo":  # a user may look at itself; others' entries (and credentials) need viewUser
            named = _named_users(db, cmd.get("usersInfo"))
            mine = set(me) if not cmd.get("showCredentials") else set()
            dbs = {db} if named is None else {d for user, d in named if (user, d) not in mine}
            yield from (("viewUser", database(d)) for d in sorted(dbs))


def required(name: str, db: str, cmd: Mapping[str, Any], *, me: Iterable[tuple[str, str]] = ()) -> list[Need]:
    """Every (action, resource) the command needs; `me` are the connection's users (a user may look
    at itself). A command not in `COMMAND_ACTIONS` needs what only members hold."""
    if name in NO_AUTH or name in AUTHENTICATED:
        return []
    if name in _ON_COLLECTION:
        target = _collection(db, cmd.get(name))
        return [(action, target) for action in sorted(_ON_COLLECTION[name])]
    if name in _ON_DATABASE:
        return [(action, database(db)) for action in sorted(_ON_DATABASE[name])]
    if name in _ON_CLUSTER:
        return [(_ON_CLUSTER[name], CLUSTER)]
    match name:
        case "aggregate":
            return list(_aggregate(db, cmd, me))
        case "explain":
            inner = cmd.get("explain")
            if isinstance(inner, Mapping) and inner:
                inner_name = next(iter(inner))
                if inner_name not in ("explain", *NO_AUTH, *AUTHENTICATED):
                    return required(inner_name, db, inner, me=me)
            return [("find", database(db))]
        case "insert" | "update" | "findAndModify" | "findandmodify":
            return list(_writes(db, name, cmd))
        case "splitVector":   # its value is a whole "<db>.<collection>"; it tells no more than a find does
            # (key boundaries: mongod asks clusterManager's splitVector, which would keep the Spark reader from
            # read-only users)
            return [("find", _full_name(cmd.get("splitVector")))]
        case "create":
            return [("createCollection", _collection(db, cmd.get("create"))), *_view_sources(db, cmd)]
        case "collMod":
            return [("collMod", _collection(db, cmd.get("collMod"))), *_view_sources(db, cmd)]
        case "renameCollection":
            return list(_rename(cmd))
        case "createUser" | "updateUser" | "dropUser" | "grantRolesToUser" | "revokeRolesFromUser" | "usersInfo":
            return list(_user_commands(name, db, cmd, me))
    return [(INTERNAL, CLUSTER)]


def authorize(name: str, db: str, cmd: Mapping[str, Any], *, authenticated: bool, held: Iterable[Grant],
              me: Iterable[tuple[str, str]] = ()) -> None:
    """Raises Unauthorized (13) unless `held` allows every action the command needs."""
    if name in NO_AUTH:
        return
    if not authenticated:
        raise MongoError(UNAUTHORIZED, f"command {name} requires authentication")
    grants = tuple(held)
    missing = [(action, resource) for action, resource in required(name, db, cmd, me=me)
               if not holds(grants, action, resource)]
    if missing:
        action, resource = missing[0]
        raise MongoError(UNAUTHORIZED, f"not authorized on {db} to execute command {_shape(name, cmd)}"
                                       f" (needs {action} on {resource})")


def _shape(name: str, cmd: Mapping[str, Any]) -> str:
    value = cmd.get(name)
    shown = repr(value) if isinstance(value, (str, int, float)) else "..."
    return "{ " + f"{name}: {shown}" + (", ..." if len(cmd) > 1 else "") + " }"
