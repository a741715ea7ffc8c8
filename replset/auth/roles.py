"""Who may run what: MongoDB's built-in roles, reduced to the privilege classes this server's commands
need, and the check each command passes before it runs. Pure: no I/O.

A command needs one privilege class on a database (`required`); a user holds classes on databases
through its roles (`grants`). A class granted on `ANY` covers every database; on `ANY_USER_DB`
every database but `local` and `config` (as MongoDB's `*AnyDatabase` roles). Commands that need no
privilege either need no authentication at all (the handshake, `ping`, authentication itself) or
only an authenticated user (sessions, cursors the user opened, transactions' ends).

Refusals are MongoDB's: `Unauthorized` (13) "command find requires authentication" without a user,
"not authorized on app to execute command { find: ... }" with one who lacks the privilege.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from base.errors import MongoError

UNAUTHORIZED = 13

READ = "read"
WRITE = "write"
DB_ADMIN = "dbAdmin"
USER_ADMIN = "userAdmin"
CLUSTER_MONITOR = "clusterMonitor"
CLUSTER_ADMIN = "clusterAdmin"
INTERNAL = "internal"  # member to member: heartbeats, votes, positions, oplog reads

ANY = "*"
ANY_USER_DB = "*user"
NON_USER_DBS = frozenset({"local", "config"})

NO_AUTH = frozenset({
    "hello", "isMaster", "ismaster", "ping", "buildInfo", "buildinfo", "saslStart", "saslContinue",
    "authenticate", "logout", "getnonce", "connectionStatus", "whatsmyuri",
})
AUTHENTICATED = frozenset({
    "startSession", "refreshSessions", "endSessions", "killSessions", "getMore", "killCursors",
    "commitTransaction", "abortTransaction", "listDatabases", "usersInfo",
})

_BY_COMMAND: dict[str, frozenset[str]] = {}


def _needs(classes: Iterable[str], *commands: str) -> None:
    for name in commands:
        _BY_COMMAND[name] = frozenset(classes)


_needs({READ}, "find", "count", "distinct", "aggregate", "listIndexes", "explain", "splitVector",
       "selectParts", "partsStatus", "partsMutations", "partsJobStatus",
       "openPartsSnapshot")
_needs({READ, DB_ADMIN}, "listCollections", "collStats", "dbStats")
_needs({WRITE}, "insert", "update", "delete", "findAndModify", "findandmodify", "insertBlock", "insertStatus",
       "alterDelete", "alterUpdate", "dropPartition", "killPartsMutation", "alterPartsTable",
       "stagePartsBlock", "commitPartsJob", "abortPartsJob")
_needs({WRITE, DB_ADMIN}, "create", "drop", "createIndexes", "dropIndexes", "deleteIndexes", "renameCollection",
       "createPartsTable", "dropPartsTable")
_needs({DB_ADMIN}, "collMod", "dropDatabase", "validate")
_needs({USER_ADMIN}, "createUser", "updateUser", "dropUser", "grantRolesToUser", "revokeRolesFromUser")
_needs({CLUSTER_MONITOR, CLUSTER_ADMIN}, "replSetGetStatus", "replSetGetConfig", "serverStatus", "hostInfo",
       "getLog", "getCmdLineOpts", "getParameter", "partsReplicationQueue")
_needs({CLUSTER_ADMIN}, "replSetReconfig", "replSetStepDown", "replSetFreeze", "replSetStepUp",
       "replSetSyncFrom", "replSetInitiate", "setParameter", "resync", "killAllSessions", "shutdown",
       "configureFailPoint", "fsync")
_needs({INTERNAL}, "replSetHeartbeat", "replSetRequestVotes", "replSetUpdatePosition", "replSetGetRBID",
       "_partsCommit", "_partsStage", "_aggregateOutput")

ROLE_GRANTS: dict[str, tuple[tuple[str, str | None], ...]] = {
    # role -> (class, database): None is the role's own database
    "read": ((READ, None),),
    "readWrite": ((READ, None), (WRITE, None)),
    "dbAdmin": ((DB_ADMIN, None),),
    "userAdmin": ((USER_ADMIN, None),),
    "dbOwner": ((READ, None), (WRITE, None), (DB_ADMIN, None), (USER_ADMIN, None)),
    "clusterMonitor": ((CLUSTER_MONITOR, ANY),),
    "clusterManager": ((CLUSTER_MONITOR, ANY), (CLUSTER_ADMIN, ANY)),
    "clusterAdmin": ((CLUSTER_MONITOR, ANY), (CLUSTER_ADMIN, ANY), (DB_ADMIN, ANY_USER_DB)),
    "readAnyDatabase": ((READ, ANY_USER_DB),),
    "readWriteAnyDatabase": ((READ, ANY_USER_DB), (WRITE, ANY_USER_DB)),
    "userAdminAnyDatabase": ((USER_ADMIN, ANY),),
    "dbAdminAnyDatabase": ((DB_ADMIN, ANY_USER_DB),),
    "root": ((READ, ANY), (WRITE, ANY_USER_DB), (DB_ADMIN, ANY), (USER_ADMIN, ANY), (CLUSTER_MONITOR, ANY),
             (CLUSTER_ADMIN, ANY)),
    "__system": ((READ, ANY), (WRITE, ANY), (DB_ADMIN, ANY), (USER_ADMIN, ANY), (CLUSTER_MONITOR, ANY),
                 (CLUSTER_ADMIN, ANY), (INTERNAL, ANY)),
}
ADMIN_ONLY_ROLES = frozenset({"clusterMonitor", "clusterManager", "clusterAdmin", "readAnyDatabase",
                              "readWriteAnyDatabase", "userAdminAnyDatabase", "dbAdminAnyDatabase", "root"})


@dataclass(frozen=True)
class Grant:
    privilege: str
    db: str  # a database, ANY or ANY_USER_DB

    def covers(self, privilege: str, db: str) -> bool:
        if privilege != self.privilege:
            return False
        if self.db == ANY:
            return True
        if self.db == ANY_USER_DB:
            return db not in NON_USER_DBS
        return self.db == db


def grants(roles: Iterable[Mapping[str, Any]]) -> frozenset[Grant]:
    """What a user's roles (`[{role, db}]`) grant."""
    out: set[Grant] = set()
    for role in roles:
        for privilege, db in ROLE_GRANTS.get(str(role.get("role")), ()):
            out.add(Grant(privilege, str(role.get("db")) if db is None else db))
    return frozenset(out)


def check_role_name(role: Mapping[str, Any]) -> None:
    """A role a user may be given: a built-in one, the cluster-wide ones on `admin` only."""
    name, db = role.get("role"), role.get("db")
    if name not in ROLE_GRANTS or name == "__system" or not isinstance(db, str):
        raise MongoError(31, f"Could not find role: {name}@{db}")
    if name in ADMIN_ONLY_ROLES and db != "admin":
        raise MongoError(31, f"Could not find role: {name}@{db}")


def required(command: str, db: str, cmd: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The privileges (class, database) a command needs, each one of which suffices for its part:
    a list of alternatives per part (empty: none beyond authentication)."""
    if command in AUTHENTICATED or command in NO_AUTH:
        return []
    classes = _BY_COMMAND.get(command, frozenset({CLUSTER_ADMIN}))  # an unlisted command: admins only
    target = db
    if command in ("find", "getMore") and db == "local" and cmd.get(command) == "oplog.rs":
        classes = frozenset({INTERNAL, READ})
    return [(c, target) for c in sorted(classes)]


def authorize(command: str, db: str, cmd: Mapping[str, Any], *, authenticated: bool,
              held: frozenset[Grant]) -> None:
    """Raises Unauthorized unless `held` covers what `command` on `db` needs."""
    if command in NO_AUTH:
        return
    if not authenticated:
        raise MongoError(UNAUTHORIZED, f"command {command} requires authentication")
    alternatives = required(command, db, cmd)
    if alternatives and not any(g.covers(p, d) for p, d in alternatives for g in held):
        raise MongoError(UNAUTHORIZED, f"not authorized on {db} to execute command {_shape(command, cmd)}")
    if command == "aggregate" and _writes(cmd) and not any(g.covers(WRITE, db) for g in held):
        raise MongoError(UNAUTHORIZED, f"not authorized on {db} to execute command {_shape(command, cmd)}")


def _writes(cmd: Mapping[str, Any]) -> bool:
    pipeline = cmd.get("pipeline")
    last = pipeline[-1] if isinstance(pipeline, list) and pipeline else None
    return isinstance(last, Mapping) and ("$out" in last or "$merge" in last)


def _shape(command: str, cmd: Mapping[str, Any]) -> str:
    return "{ " + f"{command}: {cmd.get(command)!r}" + (", ..." if len(cmd) > 1 else "") + " }"
