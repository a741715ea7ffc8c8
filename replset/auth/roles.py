"""MongoDB's built-in roles as mongod 7.0 defines them: each a set of (resource pattern, actions)
grants. Pure: no I/O.

Theory of operation. A command needs actions on resources (replset/auth/privileges.py computes them
from every namespace it touches); a user holds grants through its roles; a grant allows an action on
a resource when the action is among its actions and its pattern matches the resource. The patterns
are mongod's `ResourcePattern`s:

- `db X` matches database X itself and X's *normal* collections: not `system.*` (time-series buckets
  and `system.js` aside). So `read@admin` cannot read `admin.system.users`: only roles that name a
  system collection exactly (`userAdminAnyDatabase`, `backup`, `root`) or `anyResource` can.
- `anyNormal` matches every database's normal collections, but not `local` and `config` (the
  `*AnyDatabase` roles; mongod gives them `local` and `config` only through separate grants).
- `ns X.c` matches exactly that namespace; `cluster` the cluster; `any` everything (`__system`).

Granting is a privilege like any other: `grantRole` on database D lets its holder give roles *of D*
only (`userAdmin@A` gives `read@A`, never `root@admin`), so a user administrator of one database
cannot raise anyone above that database. Cluster-wide roles exist on `admin` only.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from base.errors import MongoError

ROLE_NOT_FOUND = 31
NON_USER_DBS = frozenset({"local", "config"})


class Kind(enum.Enum):
    CLUSTER = "cluster"
    DATABASE = "database"
    NAMESPACE = "namespace"
    ALL_DATABASES = "allDatabases"  # every database's data at once (a cluster-wide change stream)


@dataclass(frozen=True, slots=True)
class Resource:
    """What a command touches."""

    kind: Kind
    db: str = ""
    coll: str = ""

    def __str__(self) -> str:
        match self.kind:
            case Kind.NAMESPACE:
                return f"{self.db}.{self.coll}"
            case Kind.DATABASE:
                return f"database {self.db}"
        return self.kind.value


CLUSTER = Resource(Kind.CLUSTER)
ALL_DATABASES = Resource(Kind.ALL_DATABASES)


def database(db: str) -> Resource:
    return Resource(Kind.DATABASE, db)


def namespace(db: str, coll: str) -> Resource:
    return Resource(Kind.NAMESPACE, db, coll)


def is_normal(coll: str) -> bool:
    """Whether a database pattern covers the collection (mongod's `isNormalCollection`, with the
    time-series buckets and `system.js` that the database roles name besides)."""
    return not coll.startswith("system.") or coll.startswith("system.buckets.") or coll == "system.js"


class Pattern(enum.Enum):
    ANY = "anyResource"
    CLUSTER = "cluster"
    ANY_NORMAL = "anyNormal"
    DB = "db"
    NS = "ns"


@dataclass(frozen=True, slots=True)
class Grant:
    """Actions on the resources a pattern matches."""

    pattern: Pattern
    actions: frozenset[str]
    db: str = ""
    coll: str = ""

    def matches(self, resource: Resource) -> bool:
        match self.pattern:
            case Pattern.ANY:
                return True
            case Pattern.CLUSTER:
                return resource.kind is Kind.CLUSTER
            case Pattern.ANY_NORMAL:
                return resource.kind is Kind.ALL_DATABASES or (
                    resource.kind in (Kind.DATABASE, Kind.NAMESPACE) and resource.db not in NON_USER_DBS
                    and (resource.kind is Kind.DATABASE or is_normal(resource.coll)))
            case Pattern.DB:
                return resource.db == self.db and (
                    resource.kind is Kind.DATABASE or (resource.kind is Kind.NAMESPACE and is_normal(resource.coll)))
            case Pattern.NS:
                return resource.kind is Kind.NAMESPACE and (resource.db, resource.coll) == (self.db, self.coll)
        return False

    def allows(self, action: str, resource: Resource) -> bool:
        return (action in self.actions or EVERY_ACTION in self.actions) and self.matches(resource)


def holds(held: Iterable[Grant], action: str, resource: Resource) -> bool:
    return any(g.allows(action, resource) for g in held)


# The action sets of mongod's builtin_roles.cpp (the actions this server has commands for, and the
# rest of each set so that a role reads as mongod documents it).
READ = frozenset({"changeStream", "collStats", "dbHash", "dbStats", "find", "killCursors", "listCollections",
                  "listIndexes", "listSearchIndexes"})
READ_WRITE = READ | {"convertToCapped", "createCollection", "createIndex", "dropCollection", "dropIndex", "insert",
                     "remove", "renameCollectionSameDB", "update"}
DB_ADMIN = frozenset({"bypassDocumentValidation", "collMod", "collStats", "compact", "convertToCapped",
                      "createCollection", "createIndex", "dbStats", "dropCollection", "dropDatabase", "dropIndex",
                      "enableProfiler", "listCollections", "listIndexes", "planCacheIndexFilter", "planCacheRead",
                      "planCacheWrite", "reIndex", "renameCollectionSameDB", "storageDetails", "validate"})
USER_ADMIN = frozenset({"changeCustomData", "changePassword", "createRole", "createUser", "dropRole", "dropUser",
                        "grantRole", "revokeRole", "setAuthenticationRestriction", "viewRole", "viewUser"})
CLUSTER_MONITOR = frozenset({"connPoolStats", "getCmdLineOpts", "getDefaultRWConcern", "getLog", "getParameter",
                             "hostInfo", "inprog", "listDatabases", "listSessions", "netstat",
                             "replSetGetConfig", "replSetGetStatus", "serverStatus", "top"})
CLUSTER_MANAGER = frozenset({"appendOplogNote", "applicationMessage", "getDefaultRWConcern", "listSessions",
                             "replSetConfigure", "replSetGetConfig", "replSetGetStatus", "replSetStateChange",
                             "resync", "setDefaultRWConcern"})
HOST_MANAGER = frozenset({"applicationMessage", "configureFailPoint", "connPoolSync", "fsync",
                          "invalidateUserCache", "killAnyCursor", "killAnySession", "killop", "logRotate", "resync",
                          "setParameter", "shutdown", "unlock"})
EVERY_ACTION = "*"  # `__system`'s: every action
INTERNAL = "internal"  # member to member: heartbeats, votes, positions, the parts commit and stage

_SYSTEM_USERS_READ = frozenset({"collStats", "dbHash", "dbStats", "find", "killCursors", "planCacheRead"})


def _on_db(db: str, actions: frozenset[str]) -> Grant:
    return Grant(Pattern.DB, actions, db)


def _on_ns(db: str, coll: str, actions: frozenset[str]) -> Grant:
    return Grant(Pattern.NS, actions, db, coll)


def _db_role(actions: frozenset[str], *, system: Mapping[str, frozenset[str]] | None = None) -> Any:
    """A role on one database: its actions there, and on the system collections it names."""
    def grant(db: str) -> tuple[Grant, ...]:
        return (_on_db(db, actions), *(_on_ns(db, coll, acts) for coll, acts in (system or {}).items()))
    return grant


def _cluster_role(*grants: Grant) -> Any:
    return lambda _db: grants


_CLUSTER_ADMIN = (Grant(Pattern.CLUSTER, CLUSTER_MONITOR | CLUSTER_MANAGER | HOST_MANAGER),
                  Grant(Pattern.ANY_NORMAL, frozenset({"collStats", "dbHash", "dbStats", "dropDatabase",
                                                       "killCursors", "splitVector"})))
_USER_ADMIN_ANY = (Grant(Pattern.ANY_NORMAL, USER_ADMIN),
                   Grant(Pattern.CLUSTER, frozenset({"invalidateUserCache", "listDatabases", "viewUser"})),
                   _on_ns("admin", "system.users", _SYSTEM_USERS_READ))
_LIST_DATABASES = Grant(Pattern.CLUSTER, frozenset({"listDatabases"}))

BUILTIN_ROLES: dict[str, Any] = {
    "read": _db_role(READ),
    "readWrite": _db_role(READ_WRITE),
    "dbAdmin": _db_role(DB_ADMIN, system={"system.profile": READ | {"createCollection", "dropCollection"}}),
    "userAdmin": _db_role(USER_ADMIN),
    "dbOwner": _db_role(READ_WRITE | DB_ADMIN | USER_ADMIN,
                        system={"system.profile": READ | {"createCollection", "dropCollection"}}),
    "clusterMonitor": _cluster_role(Grant(Pattern.CLUSTER, CLUSTER_MONITOR),
                                    Grant(Pattern.ANY_NORMAL, frozenset({"collStats", "dbHash", "dbStats"}))),
    "clusterManager": _cluster_role(Grant(Pattern.CLUSTER, CLUSTER_MANAGER),
                                    Grant(Pattern.ANY_NORMAL, frozenset({"splitVector"}))),
    "hostManager": _cluster_role(Grant(Pattern.CLUSTER, HOST_MANAGER),
                                 Grant(Pattern.ANY_NORMAL, frozenset({"killCursors"}))),
    "clusterAdmin": _cluster_role(*_CLUSTER_ADMIN),
    "readAnyDatabase": _cluster_role(Grant(Pattern.ANY_NORMAL, READ), _LIST_DATABASES),
    "readWriteAnyDatabase": _cluster_role(Grant(Pattern.ANY_NORMAL, READ_WRITE), _LIST_DATABASES),
    "dbAdminAnyDatabase": _cluster_role(Grant(Pattern.ANY_NORMAL, DB_ADMIN), _LIST_DATABASES),
    "userAdminAnyDatabase": _cluster_role(*_USER_ADMIN_ANY),
    # backup reads every resource, system collections and `local` included (what a consistent copy needs)
    "backup": _cluster_role(Grant(Pattern.ANY, frozenset({"find", "listCollections", "listIndexes", "collStats",
                                                         "dbStats"})),
                            Grant(Pattern.CLUSTER, frozenset({"listDatabases", "serverStatus", "getParameter",
                                                              "appendOplogNote"}))),
    "root": _cluster_role(Grant(Pattern.ANY_NORMAL, READ_WRITE | DB_ADMIN | USER_ADMIN), *_CLUSTER_ADMIN,
                          *_USER_ADMIN_ANY,
                          Grant(Pattern.ANY, READ | {"listCollections", "listIndexes"})),
    "__system": _cluster_role(Grant(Pattern.ANY, frozenset({EVERY_ACTION}))),
}
ADMIN_ONLY_ROLES = frozenset({"clusterMonitor", "clusterManager", "hostManager", "clusterAdmin", "readAnyDatabase",
                              "readWriteAnyDatabase", "dbAdminAnyDatabase", "userAdminAnyDatabase", "backup", "root"})


def grants(roles: Iterable[Mapping[str, Any]]) -> frozenset[Grant]:
    """What a user's roles (`[{role, db}]`) grant."""
    out: set[Grant] = set()
    for role in roles:
        name, db = str(role.get("role")), str(role.get("db"))
        make = BUILTIN_ROLES.get(name)
        if make is not None and (name not in ADMIN_ONLY_ROLES or db == "admin"):
            out.update(make(db))
    return frozenset(out)


def check_role_name(role: Mapping[str, Any]) -> None:
    """A role a user may be given: a built-in one, the cluster-wide ones on `admin` only."""
    name, db = role.get("role"), role.get("db")
    if name not in BUILTIN_ROLES or name == "__system" or not isinstance(db, str):
        raise MongoError(ROLE_NOT_FOUND, f"Could not find role: {name}@{db}")
    if name in ADMIN_ONLY_ROLES and db != "admin":
        raise MongoError(ROLE_NOT_FOUND, f"Could not find role: {name}@{db}")
