"""Authentication and user management commands: `saslStart` / `saslContinue` (SCRAM-SHA-1 and
SCRAM-SHA-256, `skipEmptyExchange`), `speculativeAuthenticate` and `saslSupportedMechs` in `hello`,
`logout`, `connectionStatus`, and `createUser` / `updateUser` / `dropUser` / `usersInfo` /
`grantRolesToUser` / `revokeRolesFromUser` on `admin.system.users`.

Errors are mongod's: a failed exchange, an unknown user and a wrong password all answer
`AuthenticationFailed` (18) "Authentication failed."; an existing user `Location51003`; a missing one
`UserNotFound` (11); an unknown role `RoleNotFound` (31).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from bson.binary import Binary

from base.errors import MongoError
from base.scram import MECHANISMS, AuthenticationFailed, ScramConversation, make_credentials
from oplog.entry import delete_entry, update_entry
from oplog.writes import WriteEnv, collection_ui, insert_documents
from replset.auth.roles import check_role_name
from replset.auth.users import INTERNAL_USER, USERS_NS, public_user, user_id
from replset.wire.commands import CommandContext, command
from replset.wire.crud import run_write

AUTHENTICATION_FAILED = 18
USER_NOT_FOUND = 11
USER_EXISTS = 51003


def _failed() -> MongoError:
    return MongoError(AUTHENTICATION_FAILED, "Authentication failed.")


def _credentials_of(ctx: CommandContext, db: str, mechanism: str) -> Any:
    def lookup(user: str) -> Mapping[str, Any] | None:
        if (user, db) == INTERNAL_USER:
            internal = ctx.node.internal_credentials
            return None if internal is None else internal.get(mechanism)
        doc = ctx.node.store.reader.get(USERS_NS, user_id(user, db))
        return None if doc is None else (doc.get("credentials") or {}).get(mechanism)

    return lookup


def _payload(value: Any) -> bytes:
    if isinstance(value, (bytes, bytearray)):
        return bytes(value)
    if isinstance(value, str):
        return value.encode()
    raise MongoError(14, "payload must be BinData or a string")


def sasl_start(ctx: CommandContext, spec: Mapping[str, Any], db: str) -> dict[str, Any]:
    mechanism = spec.get("mechanism")
    if mechanism not in MECHANISMS:
        raise MongoError(2, f"Received authentication for mechanism {mechanism} which is unknown or not "
                            "enabled")
    options = spec.get("options")
    skip = isinstance(options, Mapping) and bool(options.get("skipEmptyExchange"))
    conversation = ScramConversation(str(mechanism), _credentials_of(ctx, db, str(mechanism)), db=db,
                                     skip_empty_exchange=skip)
    try:
        answer = conversation.first(_payload(spec.get("payload", b"")))
    except AuthenticationFailed:
        raise _failed() from None
    auth = ctx.conn.auth
    auth.next_conversation += 1
    auth.conversations = {auth.next_conversation: conversation}  # one exchange at a time per connection
    return {"conversationId": auth.next_conversation, "done": False, "payload": Binary(answer)}


@command("saslStart")
async def cmd_sasl_start(ctx: CommandContext) -> dict[str, Any]:
    return {**sasl_start(ctx, ctx.cmd, ctx.db), "ok": 1.0}


@command("saslContinue")
async def cmd_sasl_continue(ctx: CommandContext) -> dict[str, Any]:
    auth = ctx.conn.auth
    conversation_id = ctx.cmd.get("conversationId")
    conversation = auth.conversations.get(conversation_id) if isinstance(conversation_id, int) else None
    if conversation is None:
        raise MongoError(17, "No SASL session state found")
    if conversation.done:  # the empty closing exchange
        auth.conversations.pop(conversation_id, None)
        return {"conversationId": conversation_id, "done": True, "payload": Binary(b""), "ok": 1.0}
    try:
        answer = conversation.final(_payload(ctx.cmd.get("payload", b"")))
    except AuthenticationFailed:
        auth.conversations.pop(conversation_id, None)
        raise _failed() from None
    assert conversation.user is not None
    auth.login(conversation.user, conversation.db)
    done = conversation.skip_empty_exchange
    if done:
        auth.conversations.pop(conversation_id, None)
    return {"conversationId": conversation_id, "done": done, "payload": Binary(answer), "ok": 1.0}


def hello_auth_fields(ctx: CommandContext) -> dict[str, Any]:
    """`saslSupportedMechs` and `speculativeAuthenticate` answers for a handshake that asks."""
    out: dict[str, Any] = {}
    asked = ctx.cmd.get("saslSupportedMechs")
    if isinstance(asked, str) and "." in asked:
        db, _, user = asked.partition(".")
        doc = ctx.node.store.reader.get(USERS_NS, user_id(user, db))
        if doc is not None:
            out["saslSupportedMechs"] = sorted(doc.get("credentials") or {})
    speculative = ctx.cmd.get("speculativeAuthenticate")
    if isinstance(speculative, Mapping) and "saslStart" in speculative:
        try:
            out["speculativeAuthenticate"] = sasl_start(ctx, speculative, str(speculative.get("db", "admin")))
        except MongoError:
            pass  # as mongod: no answer, and the driver authenticates the ordinary way (and fails there)
    return out


@command("logout")
async def cmd_logout(ctx: CommandContext) -> dict[str, Any]:
    ctx.conn.auth.logout(ctx.db)
    return {"ok": 1.0}


@command("authenticate")
async def cmd_authenticate(ctx: CommandContext) -> dict[str, Any]:
    raise MongoError(2, f"Unsupported mechanism {ctx.cmd.get('mechanism')!r}: use SCRAM-SHA-256 or SCRAM-SHA-1")


@command("connectionStatus")
async def cmd_connection_status(ctx: CommandContext) -> dict[str, Any]:
    users = [{"user": u, "db": d} for u, d in ctx.conn.auth.users]
    roles: list[dict[str, Any]] = []
    for user, db in ctx.conn.auth.users:
        doc = ctx.node.store.reader.get(USERS_NS, user_id(user, db))
        roles.extend((doc or {}).get("roles") or [])
    return {"authInfo": {"authenticatedUsers": users, "authenticatedUserRoles": roles}, "ok": 1.0}


# -- user management -----------------------------------------------------------------------------
def _roles(value: Any, db: str) -> list[dict[str, Any]]:
    if not isinstance(value, list):
        raise MongoError(14, "roles must be an array")
    out = []
    for role in value:
        named = {"role": role, "db": db} if isinstance(role, str) else dict(role) if isinstance(role, Mapping) else None
        if named is None:
            raise MongoError(14, "a role must be a string or an object with role and db")
        check_role_name(named)
        out.append({"role": named["role"], "db": named["db"]})
    return out


def _mechanisms(cmd: Mapping[str, Any]) -> tuple[str, ...]:
    asked = cmd.get("mechanisms", list(MECHANISMS))
    if not isinstance(asked, list) or not asked or any(m not in MECHANISMS for m in asked):
        raise MongoError(2, f"mechanisms must be a non-empty subset of {list(MECHANISMS)}")
    return tuple(asked)


def _password(cmd: Mapping[str, Any]) -> str:
    pwd = cmd.get("pwd")
    if not isinstance(pwd, str) or not pwd:
        raise MongoError(2, "Must provide a 'pwd' field for all user documents, except those with '$external' "
                            "as the user's source db")
    if cmd.get("digestPassword") is False:
        raise MongoError(2, "Use of SCRAM-SHA-256 requires undigested passwords")
    return pwd


def _user_name(value: Any) -> str:
    if not isinstance(value, str) or not value or "\0" in value:
        raise MongoError(2, "User name must be a non-empty string")
    return value


@command("createUser")
async def cmd_create_user(ctx: CommandContext) -> dict[str, Any]:
    user, db = _user_name(ctx.cmd["createUser"]), ctx.db
    if db in ("local", "config") or (user, db) == INTERNAL_USER:
        raise MongoError(2, f"Cannot create users in the {db} database")
    roles = _roles(ctx.cmd.get("roles", []), db)
    credentials = make_credentials(user, _password(ctx.cmd), _mechanisms(ctx.cmd))
    doc: dict[str, Any] = {"_id": user_id(user, db), "userId": Binary(uuid.uuid4().bytes, 4), "user": user,
                           "db": db, "credentials": credentials, "roles": roles}
    if isinstance(ctx.cmd.get("customData"), Mapping):
        doc["customData"] = dict(ctx.cmd["customData"])

    def body(env: WriteEnv) -> dict[str, Any]:
        if env.txn.get(USERS_NS, doc["_id"]) is not None:
            raise MongoError(USER_EXISTS, f'User "{user}@{db}" already exists')
        result = insert_documents(env, USERS_NS, [doc], True)
        if result.write_errors:
            raise MongoError(int(result.write_errors[0]["code"]), str(result.write_errors[0]["errmsg"]))
        return {"ok": 1.0}

    return await run_write(ctx, body)


def _existing(env: WriteEnv, user: str, db: str) -> dict[str, Any]:
    doc = env.txn.get(USERS_NS, user_id(user, db))
    if doc is None:
        raise MongoError(USER_NOT_FOUND, f'Could not find user "{user}@{db}"')
    return doc


async def _change_user(ctx: CommandContext, user: str, change: Any) -> dict[str, Any]:
    def body(env: WriteEnv) -> dict[str, Any]:
        doc = _existing(env, user, ctx.db)
        updates = change(doc)
        if updates:
            env.emit(update_entry(USERS_NS, doc["_id"], {"$set": updates}, collection_ui(env, USERS_NS)))
        return {"ok": 1.0}

    return await run_write(ctx, body)


@command("updateUser")
async def cmd_update_user(ctx: CommandContext) -> dict[str, Any]:
    user = _user_name(ctx.cmd["updateUser"])
    updates: dict[str, Any] = {}
    if "pwd" in ctx.cmd:
        updates["credentials"] = make_credentials(user, _password(ctx.cmd), _mechanisms(ctx.cmd))
    if "roles" in ctx.cmd:
        updates["roles"] = _roles(ctx.cmd["roles"], ctx.db)
    if isinstance(ctx.cmd.get("customData"), Mapping):
        updates["customData"] = dict(ctx.cmd["customData"])
    if not updates:
        raise MongoError(2, "Must specify at least one field to update in updateUser")
    return await _change_user(ctx, user, lambda _doc: updates)


@command("grantRolesToUser")
async def cmd_grant_roles(ctx: CommandContext) -> dict[str, Any]:
    user, added = _user_name(ctx.cmd["grantRolesToUser"]), _roles(ctx.cmd.get("roles"), ctx.db)

    def change(doc: dict[str, Any]) -> dict[str, Any]:
        roles = list(doc.get("roles") or [])
        roles.extend(r for r in added if r not in roles)
        return {"roles": roles}

    return await _change_user(ctx, user, change)


@command("revokeRolesFromUser")
async def cmd_revoke_roles(ctx: CommandContext) -> dict[str, Any]:
    user, removed = _user_name(ctx.cmd["revokeRolesFromUser"]), _roles(ctx.cmd.get("roles"), ctx.db)
    return await _change_user(ctx, user, lambda doc: {"roles": [r for r in doc.get("roles") or []
                                                                  if r not in removed]})


@command("dropUser")
async def cmd_drop_user(ctx: CommandContext) -> dict[str, Any]:
    user = _user_name(ctx.cmd["dropUser"])

    def body(env: WriteEnv) -> dict[str, Any]:
        doc = _existing(env, user, ctx.db)
        env.emit(delete_entry(USERS_NS, doc["_id"], collection_ui(env, USERS_NS)))
        return {"ok": 1.0}

    return await run_write(ctx, body)


@command("usersInfo")
async def cmd_users_info(ctx: CommandContext) -> dict[str, Any]:
    """Users of this database (`1`), or those named (`"name"`, `{user, db}`, or a list of them). A
    connection sees its own users; others (and credentials) need viewUser on their database, which the
    command's check asks before this runs (replset/auth/privileges.py)."""
    spec = ctx.cmd["usersInfo"]
    wanted: list[tuple[str, str]] | None
    if spec == 1 or spec == 1.0:
        wanted = None
    else:
        items = spec if isinstance(spec, list) else [spec]
        wanted = []
        for item in items:
            if isinstance(item, str):
                wanted.append((item, ctx.db))
            elif isinstance(item, Mapping) and isinstance(item.get("user"), str):
                wanted.append((item["user"], str(item.get("db", ctx.db))))
            else:
                raise MongoError(14, "usersInfo takes 1, a user name, {user, db} or a list of them")
    reader = ctx.node.store.reader
    if wanted is None:
        docs = [d for d in reader.scan(USERS_NS) if d.get("db") == ctx.db]
    else:
        docs = [d for d in (reader.get(USERS_NS, user_id(u, d)) for u, d in wanted) if d is not None]
    show = bool(ctx.cmd.get("showCredentials"))
    return {"users": [public_user(d, show_credentials=show) for d in docs], "ok": 1.0}

