"""Which replica holds which part: the `<table>.replicas` registry, and the "has part" reports that fill it.

Theory of operation
-------------------
ClickHouse keeps a node per part under each replica in Keeper. Here the
registry is the replicated collection `<db>.system.parts.<table>.replicas`,
one document per (part, member): `{_id: "<part>@<member>", part, member, http,
checksums}` - the checksums of that member's copy, which a fetch from it is
checked against and a replica that merged the part itself compares with.
The member that inserts a block registers itself in the insert's commit. Every
other holder is registered by the primary, from reports that travel the way
write acknowledgements do:

* each member keeps the parts it holds that the registry does not yet list it
  for (`HeldReports.own`: a part it fetched, or one whose registration a
  failover lost);
* the set rides on its position reports (`replSetUpdatePosition`, or the getMore
  that carries positions) to its sync source as `partsHeld`; a member in the
  middle of a chain relays what its downstream members reported, so the
  acknowledgement of the last member of `P <- S1 <- S2` reaches the primary;
* the primary writes the registry documents (one transaction per batch) and, in
  the same transaction, marks a pending quorum insert `reached` once the
  registry counts enough holders of its part, and removes the member's
  documents of the parts a merged part replaced (it drops them once they are
  `oldPartsLifetimeSecs` old; a replica that needs one fetches the merged part);
* the registration replicates back to the reporter, which then stops reporting
  that part;
* a member that set a part aside as damaged reports it `gone` the same way, until
  the primary has removed its registration (or it holds the part again).

The reports are state, not deltas: each one says everything a member still
waits to have registered, so a lost report, a new primary or a restarted member
changes nothing but the delay. A relayed member that stops reporting is
forgotten after `RELAY_TTL_MS`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from oplog.entry import delete_entry, insert_entry, update_entry
from oplog.parts.table_replica import Checksums, checksum_docs, parse_checksums
from oplog.writes import WriteEnv, ensure_collection
from replset.parts.names import state_ns

HELD_FIELD = "partsHeld"
MAX_REPORTED_PARTS = 256   # per report: the rest follows once these are registered
RELAY_TTL_MS = 30_000
PENDING, REACHED, FAILED = "pending", "reached", "failed"


def quorum_status(record: Mapping[str, Any] | None, holders: int, required: int) -> str:
    """Where a block stands against the quorum `required` asked for now, which may be higher than the
    one its record was made with (an insert retried with a higher `insertQuorum` is deduplicated onto
    the first one's part): a failed record is failed; a record reached with at least `required` is
    reached; anything else is reached once `holders` members are registered as holding its part."""
    if record is not None:
        status = str(record.get("status", PENDING))
        if status == FAILED:
            return FAILED
        if status == REACHED and int(record.get("required", 0)) >= required:
            return REACHED
    return REACHED if holders >= required else PENDING

Holding = tuple[str, str]   # (table namespace, part name)


@dataclass(slots=True)
class HeldReports:
    """What this member reports upstream: its own unregistered parts and those relayed to it."""

    me: str
    http: str
    own: dict[Holding, Checksums] = field(default_factory=dict)   # insertion-ordered
    gone: dict[Holding, None] = field(default_factory=dict)       # set aside as damaged, maybe still registered
    relayed: dict[str, tuple[str, list[Any], list[Any], int]] = field(default_factory=dict)
    # member -> (http, parts, gone, at)

    def report(self, now_ms: int) -> list[dict[str, Any]]:
        """`partsHeld` for the next position report ([] when there is nothing to say)."""
        items, budget = [], MAX_REPORTED_PARTS
        own = list(self.own.items())[:budget]
        gone = [[ns, part] for ns, part in list(self.gone)[:MAX_REPORTED_PARTS]]
        if own or gone:
            items.append({"member": self.me, "http": self.http,
                          "parts": [[ns, part, checksum_docs(sums)] for (ns, part), sums in own]}
                         | ({"gone": gone} if gone else {}))
            budget -= len(own)
        for member, (http, parts, gone_there, at) in list(self.relayed.items()):
            if now_ms - at > RELAY_TTL_MS:
                del self.relayed[member]
            elif (budget > 0 and parts) or gone_there:
                items.append({"member": member, "http": http, "parts": parts[:budget]}
                             | ({"gone": gone_there} if gone_there else {}))
                budget -= min(len(parts), budget)
        return items

    def relay(self, items: Iterable[HeldItem], now_ms: int) -> bool:
        """Keeps what downstream members reported, to pass upstream; True if it says something new."""
        changed = False
        for member, http, parts, gone in items:
            if member == self.me:
                continue
            old = self.relayed.get(member)
            changed = changed or old is None or old[1] != parts or old[2] != gone
            self.relayed[member] = (http, parts, gone, now_ms)
        return changed


HeldItem = tuple[str, str, list[Any], list[Any]]   # (member, http, [[ns, part, checksums]], [[ns, part]] gone)


def parse_held(raw: Any) -> list[HeldItem]:
    """The `partsHeld` of a position report, as `(member, http, [[ns, part, checksums], ...], [[ns, part],
    ...] gone)`; anything malformed is ignored (reports are advisory: the primary checks each against
    the part log)."""
    out: list[HeldItem] = []
    if not isinstance(raw, list):
        return out
    for item in raw[:64]:
        if not isinstance(item, Mapping):
            continue
        member, http, parts, gone = item.get("member"), item.get("http"), item.get("parts"), item.get("gone", [])
        if not isinstance(member, str) or not isinstance(http, str) or not isinstance(parts, list) \
                or not isinstance(gone, list):
            continue
        held = [[p[0], p[1], p[2]] for p in parts[:MAX_REPORTED_PARTS]
                if isinstance(p, list) and len(p) == 3 and isinstance(p[0], str) and isinstance(p[1], str)
                and parse_checksums(p[2])]
        lost_here = [[g[0], g[1]] for g in gone[:MAX_REPORTED_PARTS]
                     if isinstance(g, list) and len(g) == 2 and isinstance(g[0], str) and isinstance(g[1], str)]
        out.append((member, http, held, lost_here))
    return out


def holder_id(part: str, member: str) -> str:
    return f"{part}@{member}"


def holder_doc(part: str, member: str, http: str, checksums: Checksums) -> dict[str, Any]:
    """A document of `<table>.replicas`: `member` holds `part`, serves it at `http`, with these checksums."""
    return {"_id": holder_id(part, member), "part": part, "member": member, "http": http,
            "checksums": checksum_docs(checksums)}


@dataclass(frozen=True, slots=True)
class Registration:
    db: str
    table: str
    part: str
    member: str
    http: str
    checksums: Checksums
    quorum_block: str | None   # the block id of the part's pending quorum insert, if it has one
    replaces: tuple[str, ...] = ()   # the parts a merged part replaced: the member's documents of them go


def register_holders(env: WriteEnv, todo: Iterable[Registration], members: Iterable[str]) -> int:
    """The primary's transaction: registers each holder not yet listed, and marks a pending quorum
    insert reached once `required` members hold its part. Returns how many holders it added."""
    hosts = list(members)
    added = 0
    for reg in todo:
        replicas_ns = state_ns(reg.db, reg.table, "replicas")
        if env.txn.get(replicas_ns, holder_id(reg.part, reg.member)) is not None:
            continue
        ensure_collection(env, replicas_ns)
        env.emit(insert_entry(replicas_ns, holder_doc(reg.part, reg.member, reg.http, reg.checksums)))
        added += 1
        for old in reg.replaces:
            if env.txn.get(replicas_ns, holder_id(old, reg.member)) is not None:
                env.emit(delete_entry(replicas_ns, holder_id(old, reg.member)))
        if reg.quorum_block is not None:
            settle_quorum(env, reg.db, reg.table, reg.part, reg.quorum_block, hosts)
    return added


def settle_quorum(env: WriteEnv, db: str, table: str, part: str, block_id: str, hosts: list[str]) -> bool:
    """Marks the pending quorum insert `block_id` reached if `required` of `hosts` are registered as
    holding `part`; True if it did."""
    quorum_ns, replicas_ns = state_ns(db, table, "quorum"), state_ns(db, table, "replicas")
    record = env.txn.get(quorum_ns, block_id) if env.txn.collection(quorum_ns) is not None else None
    if record is None or record.get("status") != PENDING or env.txn.collection(replicas_ns) is None:
        return False
    holders = sum(env.txn.get(replicas_ns, holder_id(part, host)) is not None for host in hosts)
    if holders < int(record.get("required", 0)):
        return False
    env.emit(update_entry(quorum_ns, block_id, {"$set": {"status": REACHED, "reachedTime": env.now,
                                                        "holders": holders}}))
    return True


def forget_holders(env: WriteEnv, stale: Iterable[tuple[str, str, str, str]]) -> None:
    """Removes registrations a fetch found false (`(db, table, part, member)`: the member answered it
    does not have the part)."""
    for db, table, part, member in stale:
        replicas_ns = state_ns(db, table, "replicas")
        if env.txn.collection(replicas_ns) is not None and env.txn.get(replicas_ns, holder_id(part, member)):
            env.emit(delete_entry(replicas_ns, holder_id(part, member)))


@dataclass(frozen=True, slots=True)
class LostPart:
    db: str
    table: str
    part: str
    log_id: str | None     # the log document that produces it (None: the one its dedup key names)
    block_id: str | None   # an inserted part's block: its dedup key and quorum record
    reason: str


def mark_lost(env: WriteEnv, lost: Iterable[LostPart]) -> None:
    """The primary's transaction for parts no member has: a `<table>.lost` record each, the log document
    that produced it removed, with the dedup key that names it (a retry of that insert is not
    swallowed: a dedup key never outlives its part), and a pending quorum on it marked failed. Every
    member drops its queued tasks for the part."""
    for item in lost:
        lost_ns, log_ns = state_ns(item.db, item.table, "lost"), state_ns(item.db, item.table, "log")
        blocks_ns, quorum_ns = state_ns(item.db, item.table, "blocks"), state_ns(item.db, item.table, "quorum")
        ensure_collection(env, lost_ns)
        if env.txn.get(lost_ns, item.part) is not None:
            continue
        key = (env.txn.get(blocks_ns, item.block_id)
               if item.block_id is not None and env.txn.collection(blocks_ns) is not None else None)
        log_id = item.log_id if item.log_id is not None else (str(key["log"]) if key is not None else None)
        env.emit(insert_entry(lost_ns, {"_id": item.part, "part": item.part, "logId": log_id,
                                        "reason": item.reason, "time": env.now}))
        if log_id is not None and env.txn.collection(log_ns) is not None and env.txn.get(log_ns, log_id):
            env.emit(delete_entry(log_ns, log_id))
        if key is not None and key.get("log") == log_id:
            env.emit(delete_entry(blocks_ns, item.block_id))
        if item.block_id is None or env.txn.collection(quorum_ns) is None:
            continue
        record = env.txn.get(quorum_ns, item.block_id)
        if record is not None and record.get("status") == PENDING and record.get("part") == item.part:
            env.emit(update_entry(quorum_ns, item.block_id, {"$set": {"status": FAILED, "failedTime": env.now,
                                                                      "reason": item.reason}}))
