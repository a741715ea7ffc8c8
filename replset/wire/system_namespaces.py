"""Which namespaces a client may change: the replication log and the member's own records are not
the client's to write, drop or rename.

Pure policy, asked by the command handlers before they touch storage; the member's own code writes
these namespaces through the store directly and is not subject to it. Reads stay allowed.

The codes and messages are mongod's:
- a write (insert, update, delete, findAndModify) or an index change on a protected namespace:
  `InvalidNamespace` (73) "cannot write to <ns>" (`userAllowedWriteNS`);
- dropping the live oplog: 5255000 "can't drop live oplog while replicating"; dropping another
  protected collection: `IllegalOperation` (20) "can't drop system collection <ns>";
- renaming from or to the live oplog: `IllegalOperation` "can't rename live oplog while replicating"
  / "can't rename to live oplog while replicating"; from or to another protected namespace:
  `IllegalOperation` "error with source/target namespace: cannot write to <ns>";
- dropping the `local`, `admin` or `config` database: `IllegalOperation`.

Protected, as in mongod: `local.oplog.rs`, `local.system.*` (the set's configuration, rollback
records), `config.transactions` (the retryable-write records of sessions: a client editing them
could make a retried write run twice), `admin.system.version`, `admin.system.keys`,
`admin.system.users` and `admin.system.roles` (changed only through the user commands, once users
exist). Beyond mongod, `local.replset.*` (the member's vote and recovery records) is protected as
well: mongod leaves it writable, and an edited vote record lets a member vote twice in a term.
Other `local` collections stay writable (they are never replicated). In every database,
`system.parts` and `system.parts.*` hold the part log's shared state (log entries, block ids, which
replica holds which part): only the part-log commands write them.
"""

from __future__ import annotations

from base.errors import MongoError
from replset.parts.names import PART_LOG
from replset.wire.oplog_reader import OPLOG_NS

PROTECTED_NAMESPACES = frozenset({
    OPLOG_NS,
    "config.transactions",
    "admin.system.version",
    "admin.system.keys",
    "admin.system.users",
    "admin.system.roles",
})
PROTECTED_PREFIXES = ("local.system.", "local.replset.")
SYSTEM_DATABASES = frozenset({"local", "admin", "config"})

INVALID_NAMESPACE = 73
ILLEGAL_OPERATION = 20
DROP_LIVE_OPLOG = 5255000


def is_protected(ns: str) -> bool:
    if ns in PROTECTED_NAMESPACES or ns.startswith(PROTECTED_PREFIXES):
        return True
    coll = ns.partition(".")[2]
    return coll == PART_LOG or coll.startswith(PART_LOG + ".")


def check_write(ns: str) -> None:
    """Inserts, updates, deletes, findAndModify, createIndexes, dropIndexes and create."""
    if is_protected(ns) or ns.partition(".")[2] == "system.views" or ns.partition(".")[2].startswith("system.buckets."):
        # (views are defined through create / collMod / drop, and a time-series collection's buckets
        # change through inserts into it)
        raise MongoError(INVALID_NAMESPACE, f"cannot write to {ns}")


def check_drop(ns: str) -> None:
    if ns == OPLOG_NS:
        raise MongoError(DROP_LIVE_OPLOG, "can't drop live oplog while replicating")
    if is_protected(ns):
        raise MongoError(ILLEGAL_OPERATION, f"can't drop system collection {ns}")


def check_rename(source: str, target: str) -> None:
    if source == OPLOG_NS:
        raise MongoError(ILLEGAL_OPERATION, "can't rename live oplog while replicating")
    if target == OPLOG_NS:
        raise MongoError(ILLEGAL_OPERATION, "can't rename to live oplog while replicating")
    for side, ns in (("source", source), ("target", target)):
        if is_protected(ns):
            raise MongoError(ILLEGAL_OPERATION, f"error with {side} namespace: cannot write to {ns}")


def check_drop_database(db: str) -> None:
    if db == "local":
        raise MongoError(ILLEGAL_OPERATION, "Cannot drop 'local' database while replication is active")
    if db in SYSTEM_DATABASES:
        raise MongoError(ILLEGAL_OPERATION, f"Dropping the '{db}' database is prohibited.")
