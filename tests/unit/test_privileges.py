"""Every command of the dispatch table, against every built-in role on every kind of database: the
decision of `replset.auth.privileges` next to a naive twin written from mongod's documentation
(which roles may run which kind of command where), plus every namespace a command touches besides
`$db` (pipeline sources and targets, both sides of a rename, granted roles' databases).

The twin knows roles by family, not by action: "a read on X is allowed to read/readWrite/dbOwner of X,
to the *AnyDatabase read roles on any database but local and config, and to root and backup
everywhere". A difference between the two is a bug in one of them."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import MongoError
from replset.auth.privileges import AUTHENTICATED, COMMAND_ACTIONS, NO_AUTH, authorize, required
from replset.auth.roles import ADMIN_ONLY_ROLES, grants
from replset.wire.commands import load_commands

DATABASES = ("A", "B", "admin", "local")
DB_ROLES = ("read", "readWrite", "dbAdmin", "userAdmin", "dbOwner")
ROLES = [(r, d) for r in DB_ROLES for d in DATABASES] + [(r, "admin") for r in sorted(ADMIN_ONLY_ROLES)]
USER_DB = {"A", "B", "admin"}  # (local and config are not "any database")

Role = tuple[str, str]


def _any_db(target: str) -> bool:
    return target in USER_DB


# --- the twin: which roles (name, database) allow a kind of work on a database ---------------------

def reads(role: Role, target: str) -> bool:
    """find (and so count, distinct, a pipeline's sources): backup and root read everything."""
    name, db = role
    return ((name in ("read", "readWrite", "dbOwner") and db == target)
            or (name in ("readAnyDatabase", "readWriteAnyDatabase") and _any_db(target))
            or name in ("root", "backup"))


def writes(role: Role, target: str) -> bool:
    name, db = role
    return ((name in ("readWrite", "dbOwner") and db == target)
            or (name in ("readWriteAnyDatabase", "root") and _any_db(target)))


def db_admin(role: Role, target: str) -> bool:
    name, db = role
    return ((name in ("dbAdmin", "dbOwner") and db == target)
            or (name in ("dbAdminAnyDatabase", "root") and _any_db(target)))


def creates(role: Role, target: str) -> bool:
    """createCollection, dropCollection, createIndex, dropIndex: readWrite's and dbAdmin's."""
    return writes(role, target) or db_admin(role, target)


def lists(role: Role, target: str) -> bool:
    """listCollections, listIndexes: the readers', the database administrators', backup's."""
    return reads(role, target) or db_admin(role, target)


def drops_database(role: Role, target: str) -> bool:
    return db_admin(role, target) or (role[0] == "clusterAdmin" and _any_db(target))


def user_admin(role: Role, target: str) -> bool:
    name, db = role
    return ((name in ("userAdmin", "dbOwner") and db == target)
            or (name in ("userAdminAnyDatabase", "root") and _any_db(target)))


def _cluster(*names: str) -> Callable[[Role, str], bool]:
    return lambda role, _target: role[0] in (*names, "clusterAdmin", "root")


monitors = _cluster("clusterMonitor", "clusterManager")
monitors_host = _cluster("clusterMonitor", "backup")
manages = _cluster("clusterManager")
manages_host = _cluster("hostManager")
resyncs = _cluster("clusterManager", "hostManager")
members_only: Callable[[Role, str], bool] = lambda _role, _target: False  # noqa: E731
anyone: Callable[[Role, str], bool] = lambda _role, _target: True  # noqa: E731

# command -> (the twin's family, the command document for collection "c")
DOCUMENTED: dict[str, Callable[[Role, str], bool]] = {
    **dict.fromkeys(NO_AUTH | AUTHENTICATED, anyone),
    **dict.fromkeys(("find", "count", "distinct", "aggregate", "explain", "splitVector", "selectParts",
                     "partsStatus", "partsMutations", "partsJobStatus", "openPartsSnapshot"), reads),
    **dict.fromkeys(("insert", "update", "delete", "findAndModify", "findandmodify", "insertBlock",
                     "insertStatus", "stagePartsBlock", "commitPartsJob", "abortPartsJob", "alterDelete",
                     "dropPartition", "alterUpdate", "killPartsMutation"), writes),
    **dict.fromkeys(("create", "drop", "createIndexes", "dropIndexes", "deleteIndexes", "createPartsTable",
                     "dropPartsTable"), creates),
    "listCollections": lists, "listIndexes": lists,
    **dict.fromkeys(("collMod", "validate", "alterPartsTable"), db_admin),
    "dropDatabase": drops_database, "renameCollection": lambda role, target: False,  # (below, both sides)
    **dict.fromkeys(("createUser", "updateUser", "dropUser", "usersInfo", "grantRolesToUser",
                     "revokeRolesFromUser"), user_admin),
    **dict.fromkeys(("replSetGetStatus", "replSetGetConfig", "partsReplicationQueue"), monitors),
    **dict.fromkeys(("serverStatus", "getParameter"), monitors_host),
    **dict.fromkeys(("hostInfo", "getLog", "getCmdLineOpts"), _cluster("clusterMonitor")),
    **dict.fromkeys(("replSetReconfig", "replSetInitiate", "replSetStepDown", "replSetFreeze", "replSetStepUp",
                     "replSetSyncFrom"), manages),
    "resync": resyncs,
    **dict.fromkeys(("setParameter", "fsync", "killAllSessions", "configureFailPoint", "shutdown"), manages_host),
    **dict.fromkeys(("replSetHeartbeat", "replSetRequestVotes", "replSetUpdatePosition", "replSetGetRBID",
                     "_partsCommit", "_partsStage", "_aggregateOutput"), members_only),
}

def command_doc(name: str, db: str) -> dict[str, Any]:
    """A well-formed command on collection "c" of the database `db` it is sent to."""
    special: dict[str, dict[str, Any]] = {
        "splitVector": {"splitVector": f"{db}.c"},   # (its value is a whole namespace)
        "aggregate": {"aggregate": "c", "pipeline": [{"$match": {}}]},
        "explain": {"explain": {"find": "c"}},
        "update": {"update": "c", "updates": [{"q": {}, "u": {"$set": {"x": 1}}}]},
        "createUser": {"createUser": "u", "pwd": "p", "roles": []},
        "updateUser": {"updateUser": "u", "pwd": "p"},
        "grantRolesToUser": {"grantRolesToUser": "u", "roles": ["read"]},
        "revokeRolesFromUser": {"revokeRolesFromUser": "u", "roles": ["read"]},
        "usersInfo": {"usersInfo": "someone"},
        "dropUser": {"dropUser": "u"},
        "listCollections": {"listCollections": 1},
        "dropDatabase": {"dropDatabase": 1},
    }
    return special.get(name, {name: "c"})


def allowed(roles: list[Role], name: str, db: str, cmd: dict[str, Any]) -> bool:
    held = grants([{"role": r, "db": d} for r, d in roles])
    try:
        authorize(name, db, cmd, authenticated=True, held=held)
    except MongoError as refused:
        assert refused.code == 13, refused
        return False
    return True


def test_every_command_of_the_dispatch_table_is_declared_and_documented() -> None:
    dispatch = set(load_commands())
    assert dispatch - COMMAND_ACTIONS == set(), "commands with no declared privileges"
    assert dispatch - set(DOCUMENTED) == set(), "commands the twin does not know"


@pytest.mark.parametrize("name", sorted(set(load_commands())))
def test_each_command_against_every_role_and_database(name: str) -> None:
    if name == "renameCollection":
        return  # (its two sides: test_a_rename_needs_both_sides)
    family = DOCUMENTED[name]
    for role, target in itertools.product(ROLES, DATABASES):
        cmd = command_doc(name, target)
        expected = family(role, target)
        assert allowed([role], name, target, cmd) == expected, (role, name, target)


def test_a_command_unknown_to_the_table_is_for_members_only() -> None:
    assert required("someNewCommand", "A", {"someNewCommand": 1})[0][0] == "internal"
    assert not allowed([("root", "admin")], "someNewCommand", "admin", {"someNewCommand": 1})
    assert allowed([("__system", "local")], "someNewCommand", "admin", {"someNewCommand": 1})


# --- what a command touches besides $db ------------------------------------------------------------

def _pipelines(target: str) -> dict[str, tuple[list[dict[str, Any]], Callable[[Role, str], bool]]]:
    """A pipeline on A.c that reaches into `target`, and what that part needs there."""
    into = {"db": target, "coll": "t"}
    return {
        "$out": ([{"$out": into}], writes),
        "$merge": ([{"$merge": {"into": into}}], writes),
        "$lookup": ([{"$lookup": {"from": into, "localField": "a", "foreignField": "b", "as": "j"}}], reads),
        "$graphLookup": ([{"$graphLookup": {"from": into, "startWith": "$a", "connectFromField": "a",
                                            "connectToField": "b", "as": "g"}}], reads),
        "$unionWith": ([{"$unionWith": {"coll": into}}], reads),
        "nested": ([{"$facet": {"x": [{"$lookup": {"from": into, "pipeline": [], "as": "j"}}]}}], reads),
        "deep": ([{"$lookup": {"from": "c", "as": "j", "pipeline": [{"$unionWith": {"coll": into}}]}}], reads),
    }


@pytest.mark.parametrize("stage", sorted(_pipelines("B")))
@pytest.mark.parametrize("target", DATABASES)
def test_a_pipeline_needs_its_sources_and_targets_in_every_database(stage: str, target: str) -> None:
    pipeline, needs_there = _pipelines(target)[stage]
    cmd = {"aggregate": "c", "pipeline": pipeline, "cursor": {}}
    for role in ROLES:
        expected = reads(role, "A") and needs_there(role, target)
        assert allowed([role], "aggregate", "A", cmd) == expected, (role, stage, target)
    assert allowed([("read", "A"), ("readWrite", target)], "aggregate", "A", cmd)  # two roles together


def test_a_string_out_target_is_in_the_same_database() -> None:
    cmd = {"aggregate": "c", "pipeline": [{"$out": "d"}], "cursor": {}}
    assert not allowed([("read", "A")], "aggregate", "A", cmd)
    assert allowed([("readWrite", "A")], "aggregate", "A", cmd)


def test_a_target_the_walk_cannot_read_fails_closed() -> None:
    for spec in ({"db": 5, "coll": "x"}, {"coll": ["x"]}, 7):
        cmd = {"aggregate": "c", "pipeline": [{"$out": spec}], "cursor": {}}
        assert not allowed([("dbOwner", "A")], "aggregate", "A", cmd)
        assert allowed([("__system", "local")], "aggregate", "A", cmd)


@pytest.mark.parametrize(("source", "target"), list(itertools.product(DATABASES, DATABASES)))
def test_a_rename_needs_both_sides(source: str, target: str) -> None:
    for drop_target in (False, True):
        cmd = {"renameCollection": f"{source}.x", "to": f"{target}.y", "dropTarget": drop_target}
        for role in ROLES:
            if source == target:  # renameCollectionSameDB: readWrite's and dbAdmin's
                expected = creates(role, source)
            else:
                expected = (reads(role, source) and creates(role, source) and writes(role, target)
                            and creates(role, target))
            assert allowed([role], "renameCollection", "admin", cmd) == expected, (role, cmd)


def test_cluster_wide_change_streams_need_every_database() -> None:
    stream = {"aggregate": 1, "pipeline": [{"$changeStream": {"allChangesForCluster": True}}], "cursor": {}}
    for role in ROLES:
        expected = role[0] in ("readAnyDatabase", "readWriteAnyDatabase", "root")
        assert allowed([role], "aggregate", "admin", stream) == expected, role
    on_db = {"aggregate": 1, "pipeline": [{"$changeStream": {}}], "cursor": {}}
    assert allowed([("read", "A")], "aggregate", "A", on_db)
    assert not allowed([("read", "A")], "aggregate", "B", on_db)


@pytest.mark.parametrize("role_db", DATABASES)
def test_granting_a_role_needs_grant_role_on_the_roles_database(role_db: str) -> None:
    role = {"role": "read" if role_db != "admin" else "userAdmin", "db": role_db}
    create = {"createUser": "evil", "pwd": "p", "roles": [role]}
    grant = {"grantRolesToUser": "me", "roles": [role]}
    for holder in ROLES:
        expected_create = user_admin(holder, "A") and user_admin(holder, role_db)
        assert allowed([holder], "createUser", "A", create) == expected_create, holder
        assert allowed([holder], "grantRolesToUser", "A", grant) == user_admin(holder, role_db), holder


def test_the_escalations_found_are_refused() -> None:
    owner = [("dbOwner", "A")]
    assert not allowed(owner, "createUser", "A", {"createUser": "evil", "pwd": "p",
                                                   "roles": [{"role": "userAdmin", "db": "admin"}]})
    assert not allowed(owner, "grantRolesToUser", "A", {"grantRolesToUser": "me",
                                                        "roles": [{"role": "readWrite", "db": "B"}]})
    assert allowed(owner, "createUser", "A", {"createUser": "ok", "pwd": "p", "roles": ["read"]})
    assert not allowed([("readWrite", "A")], "aggregate", "A",
                       {"aggregate": "c", "pipeline": [{"$out": {"db": "B", "coll": "pwned"}}]})
    assert not allowed([("readWrite", "A")], "aggregate", "A",
                       {"aggregate": "c", "pipeline": [{"$merge": {"into": {"db": "admin", "coll": "x"}}}]})
    assert not allowed([("readWrite", "admin")], "renameCollection", "admin",
                       {"renameCollection": "B.victim", "to": "B.keep", "dropTarget": True})


@pytest.mark.parametrize("role", [("read", "admin"), ("readWrite", "admin"), ("dbOwner", "admin"),
                                  ("readAnyDatabase", "admin"), ("dbAdminAnyDatabase", "admin")])
def test_reading_the_users_collection_needs_more_than_reading_admin(role: Role) -> None:
    assert not allowed([role], "find", "admin", {"find": "system.users"})


@pytest.mark.parametrize("role", [("root", "admin"), ("userAdminAnyDatabase", "admin"), ("backup", "admin")])
def test_the_roles_that_read_the_users_collection(role: Role) -> None:
    assert allowed([role], "find", "admin", {"find": "system.users"})


def test_users_info_on_oneself_needs_nothing_and_on_others_view_user() -> None:
    held = grants([{"role": "read", "db": "A"}])
    authorize("usersInfo", "A", {"usersInfo": "me"}, authenticated=True, held=held, me=[("me", "A")])
    for cmd in ({"usersInfo": "other"}, {"usersInfo": 1}, {"usersInfo": "me", "showCredentials": True}):
        with pytest.raises(MongoError):
            authorize("usersInfo", "A", cmd, authenticated=True, held=held, me=[("me", "A")])


def test_listing_others_sessions_needs_list_sessions() -> None:
    mine = {"aggregate": 1, "pipeline": [{"$listLocalSessions": {}}], "cursor": {}}
    everyone = {"aggregate": 1, "pipeline": [{"$listLocalSessions": {"allUsers": True}}], "cursor": {}}
    assert allowed([("read", "A")], "aggregate", "A", mine)
    assert not allowed([("read", "A")], "aggregate", "A", everyone)
    assert allowed([("clusterMonitor", "admin")], "aggregate", "A", everyone)
    held = grants([{"role": "read", "db": "A"}])
    for users, needs in (([{"user": "me", "db": "A"}], False), ([{"user": "root", "db": "admin"}], True),
                         ([{"user": "me", "db": "A"}, {"user": "x", "db": "A"}], True), ("me", True)):
        cmd = {"aggregate": 1, "pipeline": [{"$listLocalSessions": {"users": users}}], "cursor": {}}
        asks = any(action == "listSessions" for action, _ in required("aggregate", "A", cmd, me=[("me", "A")]))
        assert asks == needs, users
        if not needs:
            authorize("aggregate", "A", cmd, authenticated=True, held=held, me=[("me", "A")])


def test_cluster_roles_count_on_admin_only() -> None:
    assert grants([{"role": "root", "db": "A"}]) == frozenset()


# --- the walk never fails on odd input ------------------------------------------------------------

_VALUES = st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                       lambda inner: st.lists(inner, max_size=3) | st.dictionaries(
                           st.sampled_from(["$out", "$merge", "$lookup", "from", "into", "db", "coll", "pipeline",
                                            "$facet", "$unionWith", "allUsers", "roles", "role", "to"]),
                           inner, max_size=3), max_leaves=12)


@settings(max_examples=300, deadline=None)
@given(name=st.sampled_from(sorted(COMMAND_ACTIONS)), value=_VALUES, extra=_VALUES)
def test_any_command_document_gets_a_decision_never_a_crash(name: str, value: Any, extra: Any) -> None:
    cmd = {name: value, "pipeline": extra, "roles": extra, "to": value}
    for action, resource in required(name, "A", cmd, me=[("me", "A")]):
        assert isinstance(action, str) and resource is not None


def test_a_stage_of_two_keys_fails_closed() -> None:
    """A handler may read either key of `{$out: ..., $set: ...}` (the first, or whichever it looks for):
    what it touches cannot be told, so only members may send it (others hear 13, not the 40323 of the
    argument check)."""
    for stage in ({"$out": {"db": "B", "coll": "x"}, "$set": {"a": 1}}, {"$changeStream": {}, "$comment": 1}, {}, 5):
        cmd = {"aggregate": "c", "pipeline": [{"$match": {}}, stage], "cursor": {}}
        assert not allowed([("root", "admin")], "aggregate", "A", cmd), stage
        first = {"aggregate": 1, "pipeline": [stage], "cursor": {}}
        assert not allowed([("readAnyDatabase", "admin")], "aggregate", "admin", first), stage


def test_split_vector_needs_find_on_the_namespace_its_value_names() -> None:
    for value, allowed_for_reader in (("A.c", True), ("admin.system.users", False), ("B.c", False),
                                      ("local.oplog.rs", False), ("c", False), (5, False)):
        assert allowed([("read", "A")], "splitVector", "A", {"splitVector": value}) == allowed_for_reader, value


def test_an_aggregate_of_a_named_collection_reads_it_whatever_its_first_stage() -> None:
    for first in ({"$documents": []}, {"$currentOp": {}}, {"$listLocalSessions": {}}):
        cmd = {"aggregate": "system.users", "pipeline": [first], "cursor": {}}
        assert not allowed([("read", "admin")], "aggregate", "admin", cmd), first
        assert not allowed([], "explain", "admin", {"explain": cmd}), first
        assert allowed([("read", "A")], "aggregate", "A", {"aggregate": 1, "pipeline": [first], "cursor": {}}) \
            or "$currentOp" in first


@pytest.mark.parametrize("flag", [True, 1, 1.0, "yes"])
def test_bypassing_document_validation_needs_its_action_on_every_write(flag: Any) -> None:
    for name, cmd in (("insert", {"insert": "c", "documents": [{}]}),
                      ("update", {"update": "c", "updates": [{"q": {}, "u": {}}]}),
                      ("findAndModify", {"findAndModify": "c", "update": {}}),
                      ("aggregate", {"aggregate": "c", "pipeline": [{"$out": "d"}], "cursor": {}})):
        assert not allowed([("readWrite", "A")], name, "A", {**cmd, "bypassDocumentValidation": flag}), name
        assert allowed([("readWrite", "A"), ("dbAdmin", "A")], name, "A", {**cmd, "bypassDocumentValidation": flag})
        assert allowed([("readWrite", "A")], name, "A", {**cmd, "bypassDocumentValidation": False}), name
