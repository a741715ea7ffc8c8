"""Command arguments checked before a handler runs, in the shape of MongoDB's IDL.

Theory of operation: every registered command has a `CommandArgs` entry: the type of its own
value (`{find: "coll"}`), the types of the fields it knows, which of them are required, and
whether unknown top-level fields are refused (mongod's IDL `strict: true`). `check_command`
walks a command document once, in field order, the way an IDL parser does, and raises the
`MongoError` mongod would answer with:

- nesting deeper than `MAX_BSON_DEPTH` levels under the command  -> 15 Overflow
- a field of the wrong BSON type        -> 14 TypeMismatch, "BSON field 'find.filter' is the wrong
                                            type 'string', expected type 'object'"
- a required field missing              -> 40414 "BSON field 'getMore.collection' is missing but a
                                            required field"
- an unknown field of a strict command  -> 40415 "BSON field 'find.foo' is an unknown field."
- a number outside a validator's range  -> 51024 "BSON field 'find.skip' value must be >= 0, ..."
- other invalid values                  -> BadValue (2), FailedToParse (9), InvalidNamespace (73)

A null (or undefined) value counts as absent, as in IDL. Number fields (IDL `safeInt64`) accept
int, long, double and decimal but not bool, and are normalised in place to a Python int the
way mongod converts them (truncated toward zero, NaN to 0, clamped to 64 bits), so handlers
never see a NaN, an infinity or a Decimal128.

Generic arguments that every command accepts (`$db`, `lsid`, `$clusterTime`, `writeConcern`,
`maxTimeMS`, ...) are never refused. When a driver might send a field we do not list, the
command is left non-strict: accepting an unknown field is cheaper than breaking a driver.

No I/O here: a pure function of the command document.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import chain
from typing import Any

from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.objectid import ObjectId

from base.bson_types import bson_type
from base.errors import MongoError
from base.numbers import safe_number_long

# BSONDepth::kDefaultMaxAllowableDepth: levels of nesting under the outermost document.
MAX_BSON_DEPTH = 200
MAX_WRITE_BATCH = 100_000
_INT32_MAX = 2**31 - 1
_CONTAINERS = frozenset({dict, list})

NUMBER = ("long", "int", "decimal", "double")
INTEGER = ("long", "int")

# Fields every command accepts (mongo/idl/generic_argument.idl), the handshake's, and the
# internal ones members and drivers add.
GENERIC_FIELDS = frozenset({
    "$db", "apiVersion", "apiStrict", "apiDeprecationErrors", "maxTimeMS", "readConcern",
    "writeConcern", "lsid", "clientOperationKey", "txnNumber", "autocommit", "startTransaction",
    "stmtId", "comment", "$readPreference", "$clusterTime", "$audit", "$client",
    "$configServerState", "allowImplicitCollectionCreation", "$oplogQueryData", "$queryOptions",
    "$replData", "databaseVersion", "shardVersion", "tracking_info", "coordinator", "maxTimeMSOpOnly",
    "$configTime", "$topologyTime", "txnRetryCounter", "mayBypassWriteBlocking", "$tenant",
    "expectPrefix", "versionContext", "rawData", "$traceCtx", "$_isSelfCommand",
})


@dataclass(frozen=True, slots=True)
class Arg:
    """One field: the BSON types it accepts (empty: any) and how its value is checked."""

    types: tuple[str, ...] = ()
    required: bool = False
    minimum: int | None = None          # IDL validator `gte`
    to_int: bool = False                # IDL safeInt64: normalised to a Python int
    items: tuple[str, ...] = ()         # an array's element types (empty: any)
    struct: Struct | None = None        # an object's (or each array element's) own fields
    min_items: int = 0                  # write statements: at least one
    optional_bool: bool = False         # IDL optionalBool: its own message, null refused
    wrong_type: tuple[int, str] | None = None  # mongod's own code and message ({path}, {actual})
    allowed: tuple[Any, ...] = ()       # the only values accepted (with `allowed_error`)
    allowed_error: tuple[int, str] = (2, "")


@dataclass(frozen=True, slots=True)
class Struct:
    fields: Mapping[str, Arg]
    strict: bool = False


@dataclass(frozen=True, slots=True)
class CommandArgs:
    value: Arg = field(default_factory=Arg)
    fields: Mapping[str, Arg] = field(default_factory=dict)
    strict: bool = False
    collection: bool = False            # the value names a collection (InvalidNamespace rules)


# -- building blocks -----------------------------------------------------------------------
def _obj(required: bool = False, struct: Struct | None = None) -> Arg:
    return Arg(("object",), required=required, struct=struct)


def _num(minimum: int | None = None, required: bool = False) -> Arg:
    return Arg(NUMBER, required=required, minimum=minimum, to_int=True)


def _bool() -> Arg:
    return Arg(("bool",))


def _safe_bool() -> Arg:
    return Arg(("bool", *NUMBER))


def _opt_bool() -> Arg:
    return Arg(("bool",), optional_bool=True)


def _str(required: bool = False) -> Arg:
    return Arg(("string",), required=required)


def _array(items: tuple[str, ...] = (), required: bool = False, struct: Struct | None = None,
           min_items: int = 0) -> Arg:
    return Arg(("array",), required=required, items=items, struct=struct, min_items=min_items)


# Cursor ids are int64 in mongod; an int32 is accepted too (a small id a client re-encoded).
_WRONG_LONG = (14, "BSON field '{path}' is the wrong type '{actual}', expected type 'long'")
_HINT = Arg(("string", "object"), wrong_type=(9, "Hint must be a string or an object"))
_COLLECTION = Arg(("string",))
_ANY = Arg()
_CURSOR = _obj(struct=Struct({"batchSize": _num(minimum=0)}))
_WRITE_BASE: dict[str, Arg] = {
    "ordered": _bool(), "bypassDocumentValidation": _safe_bool(), "stmtIds": _array(INTEGER),
    "let": _obj(), "runtimeConstants": _obj(), "encryptionInformation": _obj(),
    "collectionUUID": Arg(("binData",)), "isTimeseriesNamespace": _bool(),
    "bypassEmptyTsReplacement": _bool(),
}
_UPDATE_STATEMENT = Struct({
    "q": _obj(required=True),
    "u": Arg(("object", "array"), required=True,
             wrong_type=(9, "Update argument must be either an object or an array")),
    "c": _obj(), "arrayFilters": _array(("object",)), "hint": _HINT, "multi": _bool(),
    # No "sort": a statement's sort is MongoDB 8.0's, and this server answers as the 7.0 it reports
    # (maxWireVersion 21): "BSON field 'update.updates.sort' is an unknown field" (40415).
    "upsert": _bool(), "upsertSupplied": _opt_bool(), "collation": _obj(),
    "sampleId": _ANY, "$_allowShardKeyUpdatesWithoutFullShardKeyInQuery": _ANY,
}, strict=True)
_DELETE_STATEMENT = Struct({
    "q": _obj(required=True),
    "limit": Arg(NUMBER, required=True, allowed=(0, 1),
                 allowed_error=(9, "The limit field in delete objects must be 0 or 1. Got {value}")),
    "hint": _HINT, "collation": _obj(), "sampleId": _ANY,
})


def _collection_command(fields: Mapping[str, Arg], *, strict: bool = True) -> CommandArgs:
    return CommandArgs(value=_COLLECTION, fields=fields, strict=strict, collection=True)


_FIND = _collection_command({
    "filter": _obj(), "projection": _obj(), "sort": _obj(), "hint": _HINT, "collation": _obj(),
    "skip": _num(minimum=0), "limit": _num(minimum=0), "batchSize": _num(minimum=0),
    "ntoreturn": _num(minimum=0), "singleBatch": _opt_bool(), "allowDiskUse": _opt_bool(),
    "min": _obj(), "max": _obj(), "returnKey": _opt_bool(), "showRecordId": _opt_bool(),
    "tailable": _opt_bool(), "oplogReplay": _ANY, "noCursorTimeout": _opt_bool(),
    "awaitData": _opt_bool(), "allowPartialResults": _opt_bool(), "let": _obj(), "options": _obj(),
    "term": _num(), "readOnce": _opt_bool(), "allowSpeculativeMajorityRead": _opt_bool(),
    "$_requestResumeToken": _opt_bool(), "$_resumeAfter": _obj(), "runtimeConstants": _obj(),
    "collectionUUID": Arg(("binData",)), "encryptionInformation": _obj(),
    "includeQueryStatsMetrics": _bool(), "sampleId": _ANY, "mirrored": _ANY,
    "$_startAt": _ANY, "$_originalQueryShapeHash": _ANY,
})

_AGGREGATE = CommandArgs(value=Arg(("string", *NUMBER),
                                   wrong_type=(9, "Invalid command format: the 'aggregate' field must "
                                                  "specify a collection name or 1")),
                         strict=True, fields={
    "pipeline": _array(("object",), required=True), "explain": _bool(), "allowDiskUse": _opt_bool(),
    "cursor": _CURSOR, "bypassDocumentValidation": _safe_bool(), "collation": _obj(), "hint": _HINT,
    "let": _obj(), "needsMerge": _opt_bool(), "fromMongos": _opt_bool(), "fromRouter": _opt_bool(),
    "runtimeConstants": _obj(), "collectionUUID": Arg(("binData",)), "exchange": _obj(),
    "isMapReduceCommand": _opt_bool(), "encryptionInformation": _obj(), "sampleId": _ANY,
    "$_requestReshardingResumeToken": _opt_bool(), "$_requestResumeToken": _opt_bool(),
    "$_resumeAfter": _obj(), "$_generateV2ResumeTokens": _opt_bool(), "passthroughToShard": _obj(),
    "includeQueryStatsMetrics": _bool(), "mirrored": _ANY, "$_originalQueryShapeHash": _ANY,
    "isClusterQueryWithoutShardKeyCmd": _ANY, "$_isClusterQueryWithoutShardKeyCmd": _ANY,
})

_CRUD: dict[str, CommandArgs] = {
    "find": _FIND,
    "getMore": CommandArgs(value=Arg(INTEGER, wrong_type=_WRONG_LONG), strict=True, fields={
        "collection": _str(required=True), "batchSize": _num(minimum=0), "term": _num(),
        "lastKnownCommittedOpTime": _obj(), "includeQueryStatsMetrics": _bool(),
        "$replPositions": _obj(),  # a fetcher's position report riding on its getMore
    }),
    "killCursors": _collection_command({"cursors": Arg(("array",), required=True, items=INTEGER,
                                                       wrong_type=None)}),
    "aggregate": _AGGREGATE,
    "count": _collection_command({
        "query": _obj(), "limit": _num(), "skip": _num(minimum=0), "hint": _HINT, "collation": _obj(),
        "fields": _obj(), "collectionUUID": Arg(("binData",)), "encryptionInformation": _obj(),
        "sampleId": _ANY, "mirrored": _ANY, "$_originalQueryShapeHash": _ANY,
    }),
    "distinct": _collection_command({
        "key": _str(required=True), "query": _obj(), "collation": _obj(), "hint": _HINT,
        "collectionUUID": Arg(("binData",)), "sampleId": _ANY, "mirrored": _ANY,
        "includeQueryStatsMetrics": _bool(), "$_originalQueryShapeHash": _ANY,
    }),
    "insert": _collection_command({
        **_WRITE_BASE, "documents": _array(("object",), required=True, min_items=1)}),
    "update": _collection_command({
        **_WRITE_BASE, "updates": _array(required=True, struct=_UPDATE_STATEMENT, min_items=1)}),
    "delete": _collection_command({
        **_WRITE_BASE, "deletes": _array(required=True, struct=_DELETE_STATEMENT, min_items=1)}),
    "findAndModify": _collection_command({
        "query": _obj(), "fields": _obj(), "sort": _obj(), "hint": _HINT, "collation": _obj(),
        "arrayFilters": _array(("object",)), "remove": _safe_bool(), "new": _safe_bool(),
        "upsert": _safe_bool(), "bypassDocumentValidation": _safe_bool(), "let": _obj(),
        "update": Arg(("object", "array"),
                      wrong_type=(9, "Update argument must be either an object or an array")),
        "runtimeConstants": _obj(), "encryptionInformation": _obj(), "sampleId": _ANY,
        "collectionUUID": Arg(("binData",)), "stmtId": _ANY,
    }),
}
_CRUD["findandmodify"] = _CRUD["findAndModify"]

_LIST = {"cursor": _CURSOR}
_CLUSTERED_INDEX = Struct({"key": _obj(required=True), "unique": _bool(), "name": _str(), "v": _num()},
                          strict=True)
_DDL: dict[str, CommandArgs] = {
    "create": _collection_command({
        "capped": _safe_bool(), "size": _num(), "max": _num(), "autoIndexId": _safe_bool(),
        "idIndex": _obj(), "storageEngine": _obj(), "validator": _obj(), "validationLevel": _str(),
        "validationAction": _str(), "indexOptionDefaults": _obj(), "viewOn": _str(),
        "pipeline": _array(("object",)), "collation": _obj(), "changeStreamPreAndPostImages": _obj(),
        "timeseries": _obj(), "clusteredIndex": Arg(("bool", "object"), struct=_CLUSTERED_INDEX),
        "expireAfterSeconds": _num(),
        "encryptedFields": _obj(), "temp": _safe_bool(), "flags": _num(), "recordPreImages": _safe_bool(),
        "collectionUUID": Arg(("binData",)), "$_internalCreateCollection": _ANY,
    }),
    "drop": _collection_command({"collectionUUID": Arg(("binData",))}),
    "dropDatabase": CommandArgs(strict=True),
    "createIndexes": _collection_command({
        "indexes": _array(("object",), required=True), "commitQuorum": Arg(("string", *NUMBER)),
        "ignoreUnknownIndexOptions": _safe_bool(), "isTimeseriesNamespace": _bool(),
        "collectionUUID": Arg(("binData",)), "returnOnStart": _bool(),
    }),
    "dropIndexes": _collection_command({
        "index": Arg(("string", "object", "array"), required=True), "isTimeseriesNamespace": _bool(),
        "collectionUUID": Arg(("binData",)),
    }),
    "listCollections": CommandArgs(strict=True, fields={
        "filter": _obj(), "nameOnly": _safe_bool(), "authorizedCollections": _safe_bool(),
        "includePendingDrops": _safe_bool(), **_LIST,
    }),
    "listIndexes": _collection_command({
        "includeBuildUUIDs": _safe_bool(), "includeIndexBuildInfo": _safe_bool(),
        "isTimeseriesNamespace": _bool(), "collectionUUID": Arg(("binData",)), **_LIST,
    }),
    "listDatabases": CommandArgs(strict=True, fields={
        "filter": _obj(), "nameOnly": _safe_bool(), "authorizedDatabases": _safe_bool(),
    }),
}
_DDL["deleteIndexes"] = _DDL["dropIndexes"]

_TOPOLOGY_VERSION = Struct({"processId": Arg(("objectId",), required=True),
                            "counter": Arg(INTEGER, required=True, wrong_type=_WRONG_LONG)})
_HELLO = CommandArgs(fields={
    "topologyVersion": _obj(struct=_TOPOLOGY_VERSION), "maxAwaitTimeMS": _num(minimum=0), "client": _obj(),
    "compression": _array(("string",)), "saslSupportedMechs": _str(), "speculativeAuthenticate": _obj(),
})
_SESSIONS = CommandArgs(value=_array(("object",)))
_ADMIN: dict[str, CommandArgs] = {
    "hello": _HELLO, "isMaster": _HELLO, "ismaster": _HELLO,
    "getLog": CommandArgs(value=Arg(("string",), required=True,
                                    wrong_type=(14, "Argument to getLog must be of type String; "
                                                    "found {value!r} of type {actual}"))),
    "connectionStatus": CommandArgs(fields={"showPrivileges": _safe_bool()}),
    "endSessions": _SESSIONS, "killSessions": _SESSIONS, "refreshSessions": _SESSIONS,
    "killAllSessions": _SESSIONS,
}

_REPL: dict[str, CommandArgs] = {
    "replSetInitiate": CommandArgs(value=Arg(("object", *NUMBER, "bool", "string"))),
    "replSetGetConfig": CommandArgs(fields={"commitmentStatus": _safe_bool(),
                                            "includeNewlyAdded": _safe_bool()}),
    "replSetGetStatus": CommandArgs(fields={"initialSync": _num()}),
    "replSetStepDown": CommandArgs(value=Arg(NUMBER), fields={
        "secondaryCatchUpPeriodSecs": Arg(NUMBER), "force": _ANY}),
    "replSetFreeze": CommandArgs(value=Arg(NUMBER, required=True)),
    "replSetStepUp": CommandArgs(fields={"skipDryRun": _safe_bool()}),
    "replSetSyncFrom": CommandArgs(value=_str(required=True)),
    "replSetReconfig": CommandArgs(value=_obj(required=True), fields={"force": _ANY}),
    "replSetHeartbeat": CommandArgs(value=_str(required=True), fields={
        "configVersion": Arg(NUMBER), "configTerm": Arg(NUMBER), "from": _str(), "fromId": Arg(NUMBER),
        "term": Arg(NUMBER), "hbv": Arg(NUMBER), "checkEmpty": _ANY}),
    "replSetRequestVotes": CommandArgs(fields={
        "setName": _str(required=True), "dryRun": _ANY, "term": Arg(NUMBER, required=True),
        "candidateIndex": Arg(NUMBER, required=True), "configVersion": Arg(NUMBER),
        "configTerm": Arg(NUMBER), "lastAppliedOpTime": _obj(), "lastCommittedOp": _obj()}),
    "replSetUpdatePosition": CommandArgs(fields={"optimes": _array(("object",), required=True)}),
    "configureFailPoint": CommandArgs(value=_str(required=True), fields={
        "mode": Arg(("string", "object")), "data": _obj()}),
    "resync": CommandArgs(fields={"wait": _ANY}),
}

_PARTS: dict[str, CommandArgs] = {
    "createPartsTable": _collection_command({
        "columns": _array(("object",), required=True), "partitionBy": _str(),
        "orderBy": Arg(("string", "array")), "settings": _obj(),
    }),
    "dropPartsTable": _collection_command({}),
    "insertBlock": _collection_command({
        "rows": _array(("object",)), "arrow": Arg(("binData",)), "dedupToken": _str(),
        "insertQuorum": Arg(("string", *NUMBER)), "quorumTimeoutMS": _num(minimum=0),
    }),
    "selectParts": _collection_command({
        "filter": _obj(), "columns": _array(("string",)), "limit": _num(minimum=0), "batchSize": _num(minimum=0),
        "sequentialConsistency": _bool(),
    }),
    "partsStatus": _collection_command({}),
    "openPartsSnapshot": _collection_command({"key": _str(required=True), "ttlSecs": _num(minimum=1),
                                              "owner": _str()}),   # (owner: from a member only)
    "partsMutations": _collection_command({}),
    "killPartsMutation": _collection_command({"mutation": _str(required=True), "attempt": _str()}),
    "alterDelete": _collection_command({"filter": _obj(required=True), "sync": _num(), "attempt": _str()}),
    "alterUpdate": _collection_command({"filter": _obj(required=True), "set": _obj(required=True), "sync": _num(),
                                        "attempt": _str()}),
    "alterPartsTable": _collection_command({"addColumn": _obj(), "dropColumn": _str(), "renameColumn": _obj(),
                                            "alterSync": _num(), "sync": _num(), "attempt": _str()}),
    "dropPartition": _collection_command({"partition": Arg(("string", "object"), required=True), "sync": _num(),
                                          "attempt": _str()}),
    "partsReplicationQueue": _collection_command({}),
    "insertStatus": _collection_command({"blockIds": _array(("string",)), "dedupToken": _str(),
                                        "insertQuorum": Arg(("string", *NUMBER))}),
    "stagePartsBlock": _collection_command({
        "arrow": Arg(("binData",), required=True), "writeId": _str(required=True), "stageKey": _str(required=True),
    }),
    "commitPartsJob": _collection_command({
        "writeId": _str(required=True), "stages": _array(("string",), required=True), "rows": _num(minimum=0),
        "digest": _str(), "insertQuorum": Arg(("string", *NUMBER)), "quorumTimeoutMS": _num(minimum=0),
        "attempt": _str(), "replace": _bool(),
    }),
    "abortPartsJob": _collection_command({"writeId": _str(required=True), "attempt": _str()}),
    "partsJobStatus": _collection_command({"writeId": _str(required=True)}),
    "_partsStage": _collection_command({
        "blocks": _array(("object",), required=True), "source": _str(required=True),
        "writeId": _str(required=True), "attempt": _str(),
    }),
    "_partsCommit": _collection_command({
        "blocks": _array(("object",), required=True), "source": _str(required=True), "http": _str(),  # ignored: see member_http
        "attempt": _str(required=True), "quorum": _num(minimum=0), "dedupToken": _str(),
    }),
}

# Commands that take nothing but their name (any value) and the generic arguments.
_BARE = CommandArgs()
_USER_FIELDS: dict[str, Arg] = {
    "pwd": _str(), "customData": _obj(), "roles": _array(("string", "object")), "digestPassword": _safe_bool(),
    "authenticationRestrictions": _array(("object",)), "mechanisms": _array(("string",)),
}
_ROLE_CHANGE = CommandArgs(value=_str(required=True), fields={"roles": _array(("string", "object"),
                                                                              required=True)})
_SASL_PAYLOAD = Arg(("binData", "string"))
_OUTPUT_SHAPE = (9, "_aggregateOutput takes a kind ($out or $merge), documents and the fields 'on' names")
_TXN_END = CommandArgs(fields={"commitTimestamp": Arg(("timestamp",)), "recoveryToken": _obj()})
_OTHER: dict[str, CommandArgs] = {
    **dict.fromkeys(("ping", "buildInfo", "buildinfo", "hostInfo", "whatsmyuri", "getCmdLineOpts", "logout",
                     "replSetGetRBID", "startSession", "getParameter", "setParameter", "serverStatus"), _BARE),
    # (getParameter / setParameter name parameters as fields, serverStatus its sections: any values)
    "fsync": CommandArgs(fields={"lock": _safe_bool(), "async": _safe_bool()}),
    "abortTransaction": _TXN_END, "commitTransaction": _TXN_END,
    "saslStart": CommandArgs(fields={"mechanism": _str(required=True), "payload": _SASL_PAYLOAD,
                                     "options": _obj(), "autoAuthorize": _safe_bool()}),
    "saslContinue": CommandArgs(fields={"conversationId": Arg(INTEGER, required=True), "payload": _SASL_PAYLOAD}),
    "authenticate": CommandArgs(fields={"mechanism": _str(), "user": _str()}),
    "createUser": CommandArgs(value=_str(required=True), fields=_USER_FIELDS),
    "updateUser": CommandArgs(value=_str(required=True), fields=_USER_FIELDS),
    "grantRolesToUser": _ROLE_CHANGE, "revokeRolesFromUser": _ROLE_CHANGE,
    "dropUser": CommandArgs(value=_str(required=True)),
    "usersInfo": CommandArgs(value=Arg(("string", "object", "array", *NUMBER), required=True), fields={
        "showCredentials": _safe_bool(), "showCustomData": _safe_bool(), "showPrivileges": _safe_bool(),
        "showAuthenticationRestrictions": _safe_bool(), "filter": _obj()}),
    "collMod": _collection_command({
        "validator": _obj(), "validationLevel": _str(), "validationAction": _str(), "viewOn": _str(),
        "pipeline": _array(("object",)), "changeStreamPreAndPostImages": _obj(),
        "index": _obj(struct=Struct({"name": _str(), "keyPattern": _obj(), "expireAfterSeconds": _num(),
                                     "hidden": _safe_bool(), "prepareUnique": _safe_bool(),
                                     "unique": _safe_bool(), "forceNonUnique": _safe_bool()})),
        "expireAfterSeconds": Arg(("string", *NUMBER)), "timeseries": _obj(), "cappedSize": _num(),
        "cappedMax": _num(), "dryRun": _safe_bool(), "collectionUUID": Arg(("binData",)),
        "isTimeseriesNamespace": _bool(),
    }, strict=False),
    "renameCollection": CommandArgs(value=_str(required=True), fields={
        "to": _str(required=True), "dropTarget": Arg(("bool", *NUMBER, "binData")), "stayTemp": _safe_bool(),
        "collectionUUID": Arg(("binData",))}),
    # The command explained is checked as the command itself (see `check_command`).
    "explain": CommandArgs(value=_obj(required=True), fields={"verbosity": _str()}),
    "validate": _collection_command({
        "full": _safe_bool(), "repair": _safe_bool(), "background": _safe_bool(), "metadata": _safe_bool(),
        "checkBSONConformance": _safe_bool(), "enforceFastCount": _safe_bool(), "scandata": _safe_bool(),
        "fixMultikey": _safe_bool(), "collectionUUID": Arg(("binData",)),
    }, strict=False),
    "splitVector": CommandArgs(value=_str(required=True), fields={
        "keyPattern": _obj(required=True), "min": _obj(), "max": _obj(), "maxChunkSize": _num(),
        "maxChunkSizeBytes": _num(), "maxChunkObjects": _num(), "maxSplitPoints": _num(), "force": _safe_bool()}),
    # (member-only: its shape errors are its handler's, FailedToParse)
    "_aggregateOutput": _collection_command({
        "kind": Arg(("string",), required=True, wrong_type=_OUTPUT_SHAPE),
        "documents": Arg(("array",), required=True, items=("object",), wrong_type=_OUTPUT_SHAPE),
        "on": Arg(("array",), items=("string",), wrong_type=_OUTPUT_SHAPE),
        "whenMatched": Arg(("string", "array")), "whenNotMatched": _str(), "bypassDocumentValidation": _safe_bool(),
    }, strict=False),
}

COMMAND_ARGS: dict[str, CommandArgs] = {**_CRUD, **_DDL, **_ADMIN, **_REPL, **_PARTS, **_OTHER}
_DEFAULT = CommandArgs()


def args_for(name: str) -> CommandArgs:
    """The argument table of a command; commands without one take any fields."""
    return COMMAND_ARGS.get(name, _DEFAULT)


# -- checks --------------------------------------------------------------------------------------
def exceeds_depth(doc: Any, limit: int = MAX_BSON_DEPTH) -> bool:
    """True when objects/arrays nest more than `limit` levels under `doc`.

    Level by level, without recursion: a document nested deeper than Python's stack must get
    an error reply, not a RecursionError. Decoded commands hold only dicts and lists (a list
    comprehension per level: about 0.1 us a value, under 1 ms for a 1,000-document insert).
    """
    level: list[Any] = [doc]
    for _ in range(limit + 1):
        children = chain.from_iterable([v.values() if type(v) is dict else v for v in level])
        level = [c for c in children if c.__class__ in _CONTAINERS]
        if not level:
            return False
    return True


def check_command(name: str, cmd: dict[str, Any], *, depth_checked: bool = False) -> None:
    """Raises the MongoError mongod would answer a malformed `cmd` with; normalises numbers. The nesting
    of a command decoded off the event loop was checked there (`depth_checked`)."""
    if not depth_checked and exceeds_depth(cmd):
        raise MongoError(15, "BSONObj exceeds maximum nested object depth", extra={"codeName": "Overflow"})
    spec = args_for(name)
    _check_value(name, cmd, spec)
    _check_fields(name, cmd, spec.fields, spec.strict, skip_first=True)
    _check_max_time_ms(cmd)
    if name == "explain":
        _check_explained(cmd["explain"])


def _check_explained(inner: dict[str, Any]) -> None:
    """The command `explain` is asked about is checked as that command would be (as mongod parses it
    with the command's own parser); a command explain does not know is left to the handler."""
    inner_name = next(iter(inner), None)
    if inner_name in COMMAND_ARGS and inner_name != "explain":
        spec = COMMAND_ARGS[inner_name]
        _check_value(inner_name, inner, spec)
        _check_fields(inner_name, inner, spec.fields, spec.strict, skip_first=True)


def _check_value(name: str, cmd: dict[str, Any], spec: CommandArgs) -> None:
    value = cmd.get(name)
    if spec.collection:
        if arg_type(value) != "string":
            raise MongoError(73, f"collection name has invalid type {arg_type(value)}")
        if not value:
            raise MongoError(73, f"Invalid namespace specified '{cmd.get('$db', '')}.'")
        return
    _check_arg(name, cmd, name, spec.value, path=name)


def _check_fields(owner: str, doc: dict[str, Any], fields: Mapping[str, Arg], strict: bool, *,
                  skip_first: bool) -> None:
    """One struct: types of known fields, unknown fields of a strict one, required ones present."""
    keys = iter(doc)
    if skip_first:
        next(keys, None)
    for key in list(keys):
        arg = fields.get(key)
        if arg is None:
            if strict and key not in GENERIC_FIELDS:
                raise MongoError(40415, f"BSON field '{owner}.{key}' is an unknown field.")
            continue
        _check_arg(key, doc, key, arg, path=f"{owner}.{key}")
    for key, arg in fields.items():
        if arg.required and doc.get(key) is None:
            raise MongoError(40414, f"BSON field '{owner}.{key}' is missing but a required field")


def _check_arg(key: str, doc: dict[str, Any], name: str, arg: Arg, *, path: str) -> None:
    value = doc.get(key)
    if value is None:
        if arg.optional_bool and key in doc:
            raise _optional_bool_error(name, value)
        if arg.required:
            raise MongoError(40414, f"BSON field '{path}' is missing but a required field")
        return
    _check_type(value, arg, name, path)
    if type(value) is DBRef:  # an object a driver sent: handlers see it as the document it is
        value = doc[key] = _as_object(value)
    if arg.to_int:
        value = doc[key] = safe_number_long(value)
        if arg.minimum is not None and value < arg.minimum:
            raise MongoError(51024, f"BSON field '{path}' value must be >= {arg.minimum}, "
                                    f"actual value '{value}'")
    if arg.allowed and _as_number(value) not in arg.allowed:
        code, message = arg.allowed_error
        raise MongoError(code, message.format(value=value))
    if isinstance(value, list):
        _check_items(value, arg, path)
    elif arg.struct is not None and isinstance(value, dict):
        _check_fields(path, value, arg.struct.fields, arg.struct.strict, skip_first=False)


def _check_type(value: Any, arg: Arg, name: str, path: str) -> None:
    if not arg.types:
        return
    actual = arg_type(value)
    if actual in arg.types:
        return
    if arg.optional_bool:
        raise _optional_bool_error(name, value)
    if arg.wrong_type is not None:
        code, message = arg.wrong_type
        raise MongoError(code, message.format(path=path, actual=actual, value=value))
    raise type_mismatch(path, actual, arg.types)


def _check_items(items: list[Any], arg: Arg, path: str) -> None:
    if arg.min_items and not items:
        raise MongoError(16, f"Write batch sizes must be between 1 and {MAX_WRITE_BATCH}. Got 0 operations.")
    if len(items) > MAX_WRITE_BATCH and arg.min_items:
        return  # the handler refuses the size with its own message
    if arg.items == ("object",) and arg.struct is None and all(type(i) is dict for i in items):
        return  # the common case (documents to insert), without naming every element's type
    for i, item in enumerate(items):
        actual = arg_type(item)
        if type(item) is DBRef and actual == "object":
            item = items[i] = _as_object(item)
        if arg.struct is not None:
            if not isinstance(item, dict):
                raise type_mismatch(f"{path}.{i}", actual, ("object",))
            _check_fields(path, item, arg.struct.fields, arg.struct.strict, skip_first=False)
        elif arg.items and actual not in arg.items:
            raise type_mismatch(f"{path}.{i}", actual, arg.items)


def arg_type(value: Any) -> str:
    """The BSON type of an argument's value, as mongod names it. pymongo decodes both a dbPointer
    (the deprecated type 0x0C) and an object `{$ref, $id}` to a DBRef; one of the shape a dbPointer
    decodes to (a collection and an ObjectId, nothing more) is taken for a dbPointer. No argument
    takes a bare DBRef as its whole value, so either way the answer is a wrong type; any other DBRef
    is the object it was sent as."""
    if type(value) is DBRef and _pointer_shaped(value):
        return "dbPointer"
    return bson_type(value)


def _pointer_shaped(ref: DBRef) -> bool:
    return ref.database is None and isinstance(ref.id, ObjectId) and set(ref.as_doc()) == {"$ref", "$id"}


def _as_object(ref: DBRef) -> dict[str, Any]:
    return dict(ref.as_doc())


def _as_number(value: Any) -> Any:
    if isinstance(value, Decimal128):
        return float(value.to_decimal())
    return value


def _check_max_time_ms(cmd: dict[str, Any]) -> None:
    """The generic maxTimeMS: a non-negative 32-bit number of milliseconds (mongod's parseMaxTimeMS)."""
    value = cmd.get("maxTimeMS")
    if value is None:
        return
    if bson_type(value) not in NUMBER:
        raise MongoError(2, "maxTimeMS must be a number")
    millis = safe_number_long(value)
    if millis < 0 or millis > _INT32_MAX:
        raise MongoError(2, f"{millis} value for maxTimeMS is out of range [0, {_INT32_MAX}]")
    cmd["maxTimeMS"] = millis


def type_mismatch(path: str, actual: str, expected: tuple[str, ...]) -> MongoError:
    if len(expected) == 1:
        wanted = f"expected type '{expected[0]}'"
    else:
        wanted = f"expected types '[{', '.join(expected)}]'"
    return MongoError(14, f"BSON field '{path}' is the wrong type '{actual}', {wanted}")


def _optional_bool_error(name: str, value: Any) -> MongoError:
    return MongoError(14, f"Field '{name}' should be a boolean value, but found: {arg_type(value)}")
