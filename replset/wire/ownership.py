"""Whose a session, a cursor, a transaction or a read-snapshot pin is, and what each owner may hold
(DESIGN.md, "Authorization is by what a command touches").

- **Sessions** belong to their user, as mongod binds a session to the user digest in its lsid
  (`replset.local_sessions`). Every command naming an lsid is checked (`claim_session`): another user's
  session is refused (13), whatever the command (a statement, commitTransaction, abortTransaction,
  getMore, killCursors). `endSessions` and `killSessions` act on the caller's own sessions only: the
  ones of other users they name are left alone, as mongod 7.0 leaves them (there, an lsid without `uid`
  *is* the caller's session of that id, so another user's is simply not named); naming another user's
  `uid` is refused (13) unless the caller may kill any session (`killSessions`) or is a member.
- **Counting.** Open cursors, open transactions and pins are counted per owner (`quota_owner`): with
  access control the user, without it the connection (there is no user to tell clients apart, and a
  connection is what one runaway client holds). Members' cursors are counted apart.
- **Cluster actions.** `may_act_on_cluster` is the one place that says whether a connection holds a
  cluster-wide action (listSessions, killAnySession, killAnyCursor), from the grants of its users' roles
  as stored now (replset/auth/roles.py: clusterMonitor and clusterManager list sessions, hostManager
  kills anyone's sessions and cursors, clusterAdmin and root both, the members' `__system` everything).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any

from base.errors import MongoError
from replset.auth.access import connection_holds
from replset.auth.roles import CLUSTER
from replset.auth.users import INTERNAL_USER
from replset.cursors import Cursor
from replset.local_sessions import SessionUser, foreign_digest
from replset.owner_shares import Shares
from replset.wire.oplog_reader import OPLOG_NS

if TYPE_CHECKING:
    from replset.node import Node
    from replset.wire.commands import CommandContext

UNAUTHORIZED = 13
UNSUPPORTED_FORMAT = 12
LIST_SESSIONS = "listSessions"
KILL_ANY_SESSION = "killAnySession"
KILL_ANY_CURSOR = "killAnyCursor"
# Commands that name sessions in their value and act on no session of their own (mongod attaches no
# session to them either).
IGNORE_LSID = frozenset({"endSessions", "killSessions", "killAllSessions"})


def may_act_on_cluster(ctx: CommandContext, action: str) -> bool:
    """Whether the connection holds the cluster action `action`: always without access control (as
    mongod), else as its users' roles grant it now (a revoked role counts at once)."""
    if not ctx.node.options.auth:
        return True
    return connection_holds(ctx.node.store.reader, ctx.conn.auth, action, CLUSTER, cache=ctx.node.user_grants)


def session_user(ctx: CommandContext) -> SessionUser:
    """Whom the connection's sessions belong to: its users' full names ("user@db"), nobody's (the empty
    user) without access control."""
    if not ctx.node.options.auth:
        return SessionUser()
    users = ctx.conn.auth.users
    return SessionUser(",".join(sorted(f"{u}@{d}" for u, d in users if (u, d) != INTERNAL_USER)),
                       internal=INTERNAL_USER in users)


def quota_owner(ctx: CommandContext) -> str:
    """Whose share an open cursor, transaction or pin takes: the user's (a member's is `__system@local`);
    without access control, the connection's."""
    if not ctx.node.options.auth:
        return f"connection {ctx.conn.id}"
    return session_user(ctx).name or "@".join(INTERNAL_USER)


def claim_session(ctx: CommandContext) -> None:
    """The session the command names is recorded as its user's, or refused (13) if it is another's."""
    lsid = ctx.cmd.get("lsid")
    if lsid is None or ctx.name in IGNORE_LSID:
        return
    if ctx.node.options.auth and not ctx.conn.auth.users:
        return  # (no user yet: only commands that act on no session got here)
    ctx.node.local_sessions.used(lsid, session_user(ctx), ctx.node.now())


def register_cursor(ctx: CommandContext, cursor: Cursor) -> None:
    """Keeps `cursor` open for the connection's users, in their share (or a member's); raises the
    refusal past it."""
    auth = ctx.node.options.auth
    cursor.id = ctx.node.cursors.new_id()
    cursor.owners = tuple(ctx.conn.auth.users)
    cursor.member = INTERNAL_USER in ctx.conn.auth.users if auth else (
        cursor.ns == OPLOG_NS and ctx.conn.claims_member)
    # A member's cursors are counted per connection (each member tails on its own; without auth anyone
    # reading the oplog counts here, and must not take every member's place)
    cursor.counted_as = f"connection {ctx.conn.id}" if cursor.member else quota_owner(ctx)
    ctx.node.cursors.register(cursor, ctx.node.clock.monotonic_ms())


def check_cursor_owner(ctx: CommandContext, cursor: Cursor, *, kill: bool = False) -> None:
    """With auth on, a cursor is its users' only: another connection's getMore is 13, and so is its
    killCursors unless the caller may kill any cursor (mongod's killAnyCursor)."""
    if not ctx.node.options.auth or set(cursor.owners) <= set(ctx.conn.auth.users):
        return
    if kill and may_act_on_cluster(ctx, KILL_ANY_CURSOR):
        return
    raise MongoError(UNAUTHORIZED, f"cursor id {cursor.id} was not created by the authenticated user")


def _named_owner(ctx: CommandContext, lsid: Mapping[str, Any], user: SessionUser, may_spoof: bool) -> str | None:
    """The user an lsid of endSessions/killSessions names: the caller's unless it gives another's `uid`,
    which only a member or (killSessions) one who may kill any session may; None: any owner."""
    if not foreign_digest(dict(lsid), user):
        return user.name
    if not (user.any_session or may_spoof):
        raise MongoError(UNAUTHORIZED, "Unauthorized to set user digest in LogicalSessionId")
    return None


def sessions_to_end(ctx: CommandContext) -> list[Any]:
    """The ids of the sessions an `endSessions` / `killSessions` acts on: those it names that are the
    caller's (or the named user's); others' are left alone. `killSessions: []` is all the caller's."""
    named = ctx.cmd.get(ctx.name)
    sessions = ctx.node.local_sessions
    user = session_user(ctx)
    if not isinstance(named, list):
        return []
    if not named and ctx.name == "killSessions":
        return sessions.ids_of(None if user.any_session else {user.name})
    may_spoof = ctx.name == "killSessions" and may_act_on_cluster(ctx, KILL_ANY_SESSION)
    out = []
    for lsid in named:
        if not isinstance(lsid, Mapping) or "id" not in lsid:
            continue
        owner = _named_owner(ctx, lsid, user, may_spoof)
        found = sessions.owner(lsid["id"])
        if found is None or owner is None or user.any_session or found == owner:
            out.append(lsid["id"])
    return out


def sessions_of_users(ctx: CommandContext) -> list[Any] | None:
    """The sessions `killAllSessions` kills: of the users it names (`[{user, db}]`), everybody's for `[]`
    (None). Refused (13) without the cluster action killAnySession."""
    if not may_act_on_cluster(ctx, KILL_ANY_SESSION):
        raise MongoError(UNAUTHORIZED, "not authorized to kill other users' sessions (killAllSessions needs "
                                       "the killAnySession action on the cluster)")
    named = ctx.cmd.get(ctx.name)
    if not isinstance(named, list) or not named:
        return None
    return ctx.node.local_sessions.ids_of(_user_names(named, "killAllSessions"))


def _user_names(users: Iterable[Any], stage: str) -> set[str]:
    names = set()
    for user in users:
        if not isinstance(user, Mapping) or not isinstance(user.get("user"), str) or not isinstance(
                user.get("db"), str):
            raise MongoError(14, f"{stage}: each user is an object {{user: <string>, db: <string>}}")
        names.add(f"{user['user']}@{user['db']}" if user["user"] or user["db"] else "")
    return names


def list_local_sessions(ctx: CommandContext, spec: Any) -> list[dict[str, Any]]:
    """`$listLocalSessions`: the caller's own sessions (`{}`), those of the users named (`users`), or
    everybody's (`allUsers: true`); anyone's but one's own needs the cluster action listSessions (13)."""
    if not isinstance(spec, dict):
        raise MongoError(14, "$listLocalSessions options must be specified in an object")
    unknown = set(spec) - {"allUsers", "users"}
    if unknown:
        raise MongoError(40415, f"BSON field '$listLocalSessions.{sorted(unknown)[0]}' is an unknown field.")
    users = spec.get("users")
    if users is not None and not isinstance(users, list):
        raise MongoError(14, "$listLocalSessions: 'users' must be an array")
    if spec.get("allUsers") and users:
        raise MongoError(UNSUPPORTED_FORMAT, "$listLocalSessions may not specify {allUsers:true} and "
                                             "{users:[...]} at the same time")
    me = session_user(ctx).name
    names = None if spec.get("allUsers") else _user_names(users, "$listLocalSessions") if users else {me}
    if (names is None or names - {me}) and not may_act_on_cluster(ctx, LIST_SESSIONS):
        raise MongoError(UNAUTHORIZED, "not authorized to list other users' sessions ($listLocalSessions with "
                                       "allUsers or others' users needs the listSessions action on the cluster)")
    return ctx.node.local_sessions.listing(ctx.node.now(), names)


def share_parameters(node: Node) -> dict[str, Shares]:
    """The shares an operator sets with `setParameter` (each owner's bound), by parameter name."""
    return {"maxOpenCursorsPerUser": node.cursors.shares,
            "maxOpenTransactionsPerUser": node.transactions.shares,
            "maxPartsSnapshotsPerUser": node.parts.pin_owners.shares}


def set_share(node: Node, name: str, value: Any) -> int | None:
    """`setParameter` of a share (`maxOpenCursorsPerUser`...): its value before; None if `name` names none."""
    shares = share_parameters(node).get(name)
    if shares is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != int(value) or value < 1:
        raise MongoError(2, f"{name} must be a whole number, at least 1")
    was, shares.per_owner = shares.per_owner, int(value)
    return was


def snapshot_owner(ctx: CommandContext) -> str:
    """Whose share an `openPartsSnapshot` pin takes: the user's; for a command a member forwards to the
    primary, the user it names (`owner`), which only a member may name."""
    named = ctx.cmd.get("owner")
    if named is None:
        return session_user(ctx).name
    if ctx.node.options.auth and INTERNAL_USER not in ctx.conn.auth.users:
        raise MongoError(UNAUTHORIZED, "only a member may name the owner of a read snapshot")
    return str(named)
