"""Checkers over a recorded `History`: each returns the violations it found (empty: fine).

Safety (must hold at every moment, whatever the faults):

* `one_primary_per_term`: no two members were PRIMARY in the same term.
* `w_n_acks_had_holders`: a `w: N` ack means N members had the entry on disk by
  then; a `w: "majority"` ack means a write majority of voting members did.
* `committed_prefixes_agree`: two members never called different entries
  committed at the same optime, and no committed entry was ever rolled back.
* `acknowledged_writes_kept`: a `w: "majority"` write is in the final oplog
  and was never rolled back anywhere; any other acknowledged write is in the
  final oplog or in a rollback file (saved, never silently dropped); a write
  answered with an error before it ran appears nowhere; no write appears twice.
* `majority_reads_committed`: a majority read never returned a value whose
  write is missing from the final oplog.

Liveness (after the faults heal):

* `converged_in_time`: within the bound, one primary, every data-bearing member
  with the same oplog, the same data (equal to what the oplog produces) and a
  commit point at its last entry. Final-oplog checks above need this; without
  convergence only the liveness failure is reported for them.
* `cut_off_primaries_step_down`: a primary that can reach no majority of
  voters steps down within the bound (an election timeout, plus the heartbeat
  timeout and two heartbeat intervals it takes to notice, plus clock drift).
* `sync_sources_follow_ping`: once converged and idle, after a secondary's
  link to the primary grew slower and again after it healed, every
  secondary's chain of sources reaches the primary, and no eligible member is
  closer (true round trip) than its source by more than the change threshold
  plus the ping noise. Eligible on an idle set: the primary, and a secondary
  of a lower id syncing from the primary (a voter, if we vote). Members react
  to each other a heartbeat late, so a member whose source changed in the last
  few heartbeat intervals is not judged yet, and a secondary counts as syncing
  from the primary only if it did a few heartbeat intervals before too.

`problems` recorded by the runner (broken invariants, illegal transitions,
refused rollbacks) are failures too.
"""

from __future__ import annotations

from collections.abc import Callable

from base.optime import OpTime
from sync.sync_source import DEFAULT_CHANGE_THRESHOLD_MS
from tests.sim.history import History, Stored, SyncView


def one_primary_per_term(h: History) -> list[str]:
    by_term: dict[int, int] = {}
    out = []
    for time_ms, member, term in h.primaries:
        other = by_term.setdefault(term, member)
        if other != member:
            out.append(f"two primaries in term {term}: m{other} and m{member} (at {time_ms} ms)")
    return out


def _holders_by(records: list[Stored]) -> dict[int, list[tuple[int, int]]]:
    holders: dict[int, list[tuple[int, int]]] = {}
    for s in records:
        holders.setdefault(s.entry_hash, []).append((s.time_ms, s.member))
    return holders


def w_n_acks_had_holders(h: History) -> list[str]:
    """A w:N ack: N members had applied the entry; a w:"majority" one: a majority had it durable."""
    applied, durable = _holders_by(h.applied), _holders_by(h.stored)
    out = []
    for ack in h.acks:
        holders = durable if ack.w == "majority" else applied
        had = {m for t, m in holders.get(ack.entry_hash, []) if t <= ack.time_ms}
        if ack.w == "majority":
            voting = had & h.voting_data_members
            if len(voting) < h.write_majority:
                out.append(f"w:majority ack of write {ack.write_id} by m{ack.member} at {ack.time_ms} ms: only "
                           f"{sorted(voting)} of the voting members had it (need {h.write_majority})")
        elif isinstance(ack.w, int) and len(had) < ack.w:
            out.append(f"w:{ack.w} ack of write {ack.write_id} by m{ack.member} at {ack.time_ms} ms: only "
                       f"{sorted(had)} had it")
    return out


def committed_prefixes_agree(h: History) -> list[str]:
    out = []
    at: dict[OpTime, tuple[int, int]] = {}
    committed_hashes: dict[int, tuple[int, int]] = {}   # hash -> (first time, member)
    for c in h.committed:
        first = at.setdefault(c.optime, (c.entry_hash, c.member))
        if first[0] != c.entry_hash:
            out.append(f"committed prefixes disagree at {c.optime}: m{first[1]} and m{c.member} "
                       f"committed different entries")
        committed_hashes.setdefault(c.entry_hash, (c.time_ms, c.member))
    for rb in h.rolled_back:
        seen = committed_hashes.get(rb.entry_hash)
        # Rolled back *before* anyone called it committed is fine: another member kept it and it won later.
        if seen is not None and seen[0] <= rb.time_ms:
            out.append(f"m{rb.member} rolled back {rb.optime} (write {rb.write_id}) at {rb.time_ms} ms, which "
                       f"m{seen[1]} had called majority-committed at {seen[0]} ms")
    reference = _reference_log(h)
    if reference is not None:
        missing = [c for c in h.committed if c.entry_hash not in reference]
        for c in missing[:5]:
            out.append(f"committed entry {c.optime} (m{c.member}, {c.time_ms} ms) is not in the final oplog")
    return out



def _reference_log(h: History) -> set[int] | None:
    """The hashes of the final oplog when the set converged, or at least every member ended with
    the same oplog (only the data disagreed); None otherwise."""
    if not h.final:
        return None
    longest = max(h.final.values(), key=lambda f: len(f.hashes))
    if h.converged_ms is None and any(f.hashes != longest.hashes for f in h.final.values()):
        return None
    return set(longest.hashes)


def acknowledged_writes_kept(h: History) -> list[str]:
    out = []
    undone_by_hash: dict[int, list[int]] = {}
    for rb in h.rolled_back:
        undone_by_hash.setdefault(rb.entry_hash, []).append(rb.time_ms)
    for ack in h.acks:
        later = [t for t in undone_by_hash.get(ack.entry_hash, []) if t >= ack.time_ms]
        if ack.w == "majority" and later:
            out.append(f"w:majority write {ack.write_id} (acked by m{ack.member} at {ack.time_ms} ms) was rolled "
                       f"back at {later[0]} ms")
    reference = _reference_log(h)
    if reference is None:
        return out
    final = max(h.final.values(), key=lambda f: len(f.hashes))
    final_writes = [w for w in final.write_ids if w >= 0]
    if len(final_writes) != len(set(final_writes)):
        twice = sorted({w for w in final_writes if final_writes.count(w) > 1})
        out.append(f"writes {twice[:5]} are in the final oplog twice")
    for ack in h.acks:
        if ack.w == "majority" and ack.entry_hash not in reference:
            out.append(f"w:majority write {ack.write_id} (acked by m{ack.member} at {ack.time_ms} ms) is lost")
        elif ack.entry_hash not in reference and ack.write_id not in h.saved_writes | h.lost_in_crash:
            out.append(f"w:{ack.w} write {ack.write_id} (acked by m{ack.member} at {ack.time_ms} ms) vanished: "
                       f"neither in the final oplog nor in a rollback file, and no crash took it")
    present = set(final_writes) | h.saved_writes | {rb.write_id for rb in h.rolled_back}
    for write_id in sorted(h.failed_writes & present)[:5]:
        out.append(f"write {write_id} was answered with an error before it ran, yet it is in an oplog")
    return out


def majority_reads_committed(h: History) -> list[str]:
    final = None if _reference_log(h) is None else max(h.final.values(), key=lambda f: len(f.hashes))
    if final is None:
        return []
    kept = set(final.write_ids)
    return [f"majority read of key {r.key} on m{r.member} at {r.time_ms} ms returned write {r.write_id}, "
            f"which is not in the final oplog"
            for r in h.majority_reads if r.write_id is not None and r.write_id not in kept][:5]


def converged_in_time(h: History) -> list[str]:
    if h.heal_ms is None:
        return ["the run never reached the liveness phase"]
    if h.converged_ms is None:
        return [f"no convergence within {h.liveness_bound_ms} ms after the faults healed at {h.heal_ms} ms: "
                + _describe_final(h)]
    return []


def _describe_final(h: History) -> str:
    parts = []
    for m, f in sorted(h.final.items()):
        parts.append(f"m{m} {f.state} last={f.last_optime.term}/{f.last_optime.secs % 100_000}.{f.last_optime.inc} "
                     f"n={len(f.hashes)} commit={f.commit_point.term}/{f.commit_point.secs % 100_000}."
                     f"{f.commit_point.inc}" + ("" if f.data == f.folded else " DATA DIFFERS FROM ITS OPLOG"))
    return "; ".join(parts)


def cut_off_primaries_step_down(h: History) -> list[str]:
    out = []
    for cut in h.cut_offs:
        held = cut.end_ms - cut.since_ms
        if held > h.stepdown_bound_ms:
            how = "then stepped down" if cut.stepped_down else "and was still primary when it could reach one again"
            out.append(f"m{cut.member} stayed primary in term {cut.term} for {held} ms (from {cut.since_ms} ms) "
                       f"while it could reach no majority of voters, {how} (bound {h.stepdown_bound_ms} ms)")
    return out


def sync_sources_follow_ping(h: History) -> list[str]:
    out = []
    for view in h.sync_views:
        out += _judge_sync_view(view)
    return out


def _judge_sync_view(view: SyncView) -> list[str]:
    """Members react to each other a heartbeat late: a member whose source changed since the earlier note
    is still deciding, and a secondary counts as syncing from the primary only if it did at both looks."""
    out = []
    where = f"at {view.time_ms} ms ({view.after})"
    earlier = view.earlier if view.earlier is not None else view.sources
    for member, source in sorted(view.sources.items()):
        if earlier.get(member, source) != source:
            continue
        if source is None:
            out.append(f"m{member} has no sync source {where}")
            continue
        chain, hop = [member], source
        while hop != view.primary and hop not in chain and hop in view.sources and len(chain) <= len(view.sources):
            chain.append(hop)
            hop = view.sources[hop] if view.sources[hop] is not None else -1
        if hop != view.primary:
            out.append(f"m{member}'s chain of sync sources {' -> '.join(f'm{m}' for m in [*chain, hop])} "
                       f"never reaches the primary m{view.primary} {where}")
            continue
        eligible = [view.primary] + [
            other for other, its_source in view.sources.items()
            if other < member and its_source == view.primary and earlier.get(other) == view.primary
            and (other in view.voters or member not in view.voters)]
        best = min(eligible, key=lambda m: (view.rtt_ms[(member, m)], m))
        slack = view.rtt_ms[(member, source)] - view.rtt_ms[(member, best)]
        if slack > DEFAULT_CHANGE_THRESHOLD_MS + view.margin_ms:
            out.append(f"m{member} syncs from m{source} (round trip {view.rtt_ms[(member, source)]} ms) {where}, "
                       f"but m{best} is {slack} ms closer (change threshold {DEFAULT_CHANGE_THRESHOLD_MS:g} ms, "
                       f"ping noise {view.margin_ms:g} ms)")
    return out


def recorded_problems(h: History) -> list[str]:
    return list(h.problems)


CHECKERS: tuple[Callable[[History], list[str]], ...] = (
    recorded_problems, one_primary_per_term, w_n_acks_had_holders, committed_prefixes_agree,
    acknowledged_writes_kept, majority_reads_committed, converged_in_time, cut_off_primaries_step_down,
    sync_sources_follow_ping,
)


def check(h: History) -> list[str]:
    """Every violation, prefixed by the checker that found it."""
    out = []
    for checker in CHECKERS:
        out += [f"{checker.__name__}: {v}" for v in checker(h)]
    return out
