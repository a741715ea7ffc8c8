"""Transcript tests of the replica core, in the style of etcd's raft `testdata`.

Each file in `tests/transcripts/` is a story of one member: commands (events in,
through the core's one entry point `Replica.step`), each followed by `----` and the
actions that came out, one per line, then a blank line. Reading one shows the
protocol at work; replaying all of them checks that it still works that way.

    .venv/bin/pytest tests/unit/test_transcripts.py                 # replay; a difference fails
    REWRITE=1 .venv/bin/pytest tests/unit/test_transcripts.py       # write what the core does now

A rewritten file is read like a diff in review: every changed line is a change in
what the member does.

Commands (`at=T` sets the clock, in ms; it never goes back; `#N` names the core's Nth
call, as its `send #N` line shows):

    member me=m0 members=3 [heartbeat=MS] [election=MS] [applied=S.I@T] [term=N]
    start [initiator] [state=SECONDARY]
    tick
    heartbeat-reply #N state=S [term=N] [applied=..] [durable=..] [commit=..] [primary=mK] [source=mK]
    vote-reply #N granted|refused [term=N]
    fail #N [refused]
    persisted                      every Persist not yet reported done, in order
    noop-written [failed]
    drained
    oplog applied=.. [durable=..]  our own oplog moved
    fetcher source=mK last=..      the fetcher's source or last fetched entry moved
    heartbeat-in from=mK [term=N]
    vote-request-in from=mK term=N [applied=..] [dry-run]
    positions-in from=mK applied=.. [durable=..] [term=N]
    await w=N|majority target=.. [wtimeout=MS]   a write waits for its write concern
    step-down [freeze=MS]          replSetStepDown (after the shell found a caught-up secondary)
    step-up [skip-dry-run]         replSetStepUp
    freeze secs=N                  replSetFreeze
    sync-from to=mK                replSetSyncFrom
    show                           term, vote, state, commit point, sync source, pings
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from base.config import parse_config
from base.errors import MongoError
from base.member import MemberState
from base.messages import (
    HeartbeatReply,
    HeartbeatRequest,
    MemberPosition,
    VoteRequest,
    heartbeat_reply,
    heartbeat_request,
    parse_heartbeat_reply,
    parse_update_position,
    parse_vote_request,
    update_position_command,
    vote_request,
)
from base.optime import NULL_OPTIME, OpTime
from replset import actions as act
from replset import events as ev
from replset.replica import Replica
from replset.write_concern import WriteConcern

TRANSCRIPTS = Path(__file__).resolve().parents[1] / "transcripts"
SET_NAME = "rs0"


class HalfRandom:
    """The election timer's randomness, fixed: every timeout is the base plus half its spread."""

    def random(self) -> float:
        return 0.5


def host(member: int) -> str:
    return f"m{member}.example.net:27017"


def member_id(name: str) -> int:
    if not name.startswith("m") or not name[1:].isdigit():
        raise ValueError(f"a member is named m<id>, not {name!r}")
    return int(name[1:])


def optime(text: str) -> OpTime:
    """`100.2@1`: secs 100, increment 2, term 1; `null` for none."""
    if text == "null":
        return NULL_OPTIME
    stamp, term = text.split("@")
    secs, inc = stamp.split(".")
    return OpTime(int(secs), int(inc), int(term))


def show_optime(o: OpTime) -> str:
    return "null" if o == NULL_OPTIME else f"{o.secs}.{o.inc}@{o.term}"


class Driver:
    def __init__(self) -> None:
        self.replica: Replica | None = None
        self.now = 0
        self.calls: dict[int, act.Send] = {}
        self.persists: list[int] = []

    # -- commands -----------------------------------------------------------------------------------

    def run(self, line: str) -> list[str]:
        words = line.split()
        command, flags, args = words[0], {w for w in words[1:] if "=" not in w}, dict(
            w.split("=", 1) for w in words[1:] if "=" in w)
        if "at" in args:
            at = int(args.pop("at"))
            if at < self.now:
                raise ValueError(f"at={at} goes back in time (now {self.now})")
            self.now = at
        if command == "member":
            return self._member(args)
        if command == "show":
            return self._show()
        return [self._render(a) for a in self._events(command, flags, args)] or ["(nothing)"]

    def _member(self, args: dict[str, str]) -> list[str]:
        count = int(args["members"])
        heartbeat, election = int(args.get("heartbeat", 500)), int(args.get("election", 2500))
        config = parse_config({
            "_id": SET_NAME, "version": 1, "term": 1,
            "members": [{"_id": i, "host": host(i)} for i in range(count)],
            "settings": {"heartbeatIntervalMillis": heartbeat, "electionTimeoutMillis": election,
                         "heartbeatTimeoutSecs": 2}})
        applied = optime(args.get("applied", "100.1@-1"))
        me = member_id(args["me"])
        self.replica = Replica(me=host(me), config=config, state=MemberState.STARTUP,
                               term=int(args.get("term", 0)), last_vote=None, applied=applied, durable=applied,
                               min_valid=None, rng=HalfRandom(), now=self.now)
        return [f"m{me} of {count} members, heartbeat {heartbeat} ms, election timeout {election} ms, "
                f"applied {show_optime(applied)}"]

    def _events(self, command: str, flags: set[str], args: dict[str, str]) -> list[act.Action]:
        r = self.replica
        assert r is not None, "the first command is `member`"
        out: list[act.Action] = []
        step = r.step
        match command:
            case "start":
                state = MemberState[args["state"]] if "state" in args else None
                out += step(self.now, ev.Started(initiator="initiator" in flags, state=state))
            case "tick":
                out += step(self.now, ev.Tick())
            case "heartbeat-reply":
                send = self._call(flags)
                out += step(self.now, ev.Replied(send.call, heartbeat_reply(self._heartbeat_reply(send.to, args))))
            case "vote-reply":
                send = self._call(flags)
                granted = "granted" in flags
                doc = {"term": int(args.get("term", send.body["term"])), "voteGranted": granted,
                       "reason": "" if granted else "refused in the transcript", "ok": 1.0}
                out += step(self.now, ev.Replied(send.call, doc))
            case "fail":
                send = self._call(flags)
                out += step(self.now, ev.CallFailed(send.call, refused="refused" in flags, why="transcript"))
            case "persisted":
                tokens, self.persists = self.persists, []
                for token in tokens:
                    out += step(self.now, ev.Persisted(token))
            case "noop-written":
                out += step(self.now, ev.NoopWritten(r.term, ok="failed" not in flags))
            case "drained":
                out += step(self.now, ev.SyncDrained(True))
            case "oplog":
                out += step(self.now, ev.LocalCommit(optime(args["applied"])))
                out += step(self.now, ev.LocalDurable(optime(args.get("durable", args["applied"]))))
            case "fetcher":
                out += step(self.now, ev.FetcherMoved(host(member_id(args["source"])), optime(args["last"])))
            case "heartbeat-in":
                sender = member_id(args["from"])
                doc = heartbeat_request(HeartbeatRequest(SET_NAME, 1, 1, host(sender), sender,
                                                         int(args.get("term", r.term))))
                out += step(self.now, ev.HeartbeatIn(doc, f"heartbeat from m{sender}"))
            case "vote-request-in":
                sender = member_id(args["from"])
                doc = vote_request(VoteRequest(SET_NAME, "dry-run" in flags, int(args["term"]), sender, 1, 1,
                                               optime(args.get("applied", show_optime(r.applied)))))
                out += step(self.now, ev.VoteRequestIn(doc, f"vote request from m{sender}"))
            case "positions-in":
                sender = member_id(args["from"])
                applied = optime(args["applied"])
                position = MemberPosition(sender, applied, optime(args.get("durable", args["applied"])), 1)
                doc = update_position_command([position], int(args.get("term", r.term)))
                out += step(self.now, ev.PositionsIn(doc, f"positions from m{sender}"))
            case "await":
                w: int | str = args["w"] if args["w"] == "majority" else int(args["w"])
                target = optime(args["target"])
                wc = WriteConcern(w=w, wtimeout_ms=int(args.get("wtimeout", 0)))
                waiter = f"w:{args['w']} of the write at {show_optime(target)}"
                out += step(self.now, ev.AwaitWriteConcern(waiter, wc, target))
            case "step-down":
                out += step(self.now, ev.StepDownAsked(int(args.get("freeze", 60_000)), "replSetStepDown"))
            case "step-up":
                out += step(self.now, ev.StepUpAsked("skip-dry-run" in flags, "replSetStepUp"))
            case "freeze":
                out += step(self.now, ev.FreezeAsked(float(args["secs"]), "replSetFreeze"))
            case "sync-from":
                out += step(self.now, ev.SyncFromAsked(host(member_id(args["to"])), "replSetSyncFrom"))
            case _:
                raise ValueError(f"unknown command {command!r}")
        for action in out:
            if isinstance(action, act.Send):
                self.calls[action.call] = action
            elif isinstance(action, act.Persist):
                self.persists.append(action.token)
        return out

    def _call(self, flags: set[str]) -> act.Send:
        number = next(f for f in flags if f.startswith("#"))
        return self.calls[int(number[1:])]

    def _heartbeat_reply(self, sender: int, args: dict[str, str]) -> HeartbeatReply:
        applied = optime(args.get("applied", "100.1@-1"))
        primary = args.get("primary")
        return HeartbeatReply(
            set_name=SET_NAME, state=MemberState[args["state"]], term=int(args.get("term", 0)), applied=applied,
            durable=optime(args.get("durable", show_optime(applied))), config_version=1, config_term=1,
            sync_source=host(member_id(args["source"])) if "source" in args else "",
            commit_point=optime(args.get("commit", "null")),
            primary_id=member_id(primary) if primary else -1)

    def _show(self) -> list[str]:
        r = self.replica
        assert r is not None and r.topology is not None
        vote = "none" if r.last_vote is None else f"m{r.last_vote.candidate_id} in term {r.last_vote.term}"
        lines = [f"m{r.self_id} {r.state.name}, term {r.term}, vote {vote}, applied {show_optime(r.applied)}, "
                 f"commit point {show_optime(r.commit_point)}, sync source {self._name(r.sync_source) or 'none'}"]
        for peer, data in sorted(r.topology.members.items()):
            ping = "unknown" if data.ping.value_ms is None else f"{data.ping.value_ms:.1f} ms"
            lines.append(f"  m{peer}: {data.state.name}, applied {show_optime(data.applied)}, ping {ping}")
        return lines

    # -- output -------------------------------------------------------------------------------------

    @staticmethod
    def _name(h: str) -> str:
        return h.split(".", 1)[0] if h else ""

    def _render(self, action: act.Action) -> str:
        match action:
            case act.Send(to=to, kind=kind, body=body, call=call, timeout_ms=timeout):
                return f"send #{call} {kind.value} -> m{to} ({self._describe_request(kind, body)}; " \
                       f"timeout {timeout} ms)"
            case act.Persist(term=term, last_vote=vote, token=token):
                voted = "no vote" if vote is None else f"vote for m{vote.candidate_id} in term {vote.term}"
                return f"persist term {term}, {voted} (token {token})"
            case act.Answer(reply_to=to, body=body):
                return f"answer {to}: {self._describe_answer(body)}"
            case act.StateChanged(old=old, new=new):
                return f"state {old.name} -> {new.name}"
            case act.StopFetching(drain=drain):
                return "stop fetching" + (", draining what is buffered" if drain else "")
            case act.WriteNoop(term=term):
                return f"write the new primary's no-op in term {term}"
            case act.ChangeSyncSource(reason=reason):
                return f"change sync source: {reason}"
            case act.TermRefused(term=term, source=source):
                return f"refuse term {term} from {source}"
            case act.Wake(waiter=waiter, error=error):
                return f"wake {waiter}: " + ("satisfied" if error is None else f"error {error.code}: {error}")
            case _:
                return type(action).__name__

    def _describe_request(self, kind: act.CallKind, body: dict[str, Any]) -> str:
        if kind is act.CallKind.VOTE:
            req = parse_vote_request(body)
            return (f"term {req.term}{', dry run' if req.dry_run else ''}, last applied "
                    f"{show_optime(req.last_applied)}")
        if kind is act.CallKind.POSITIONS:
            positions, term = parse_update_position(body)
            return f"term {term}: " + ", ".join(
                f"m{p.member_id} applied {show_optime(p.applied)} durable {show_optime(p.durable)}"
                for p in positions)
        return f"term {int(body['term'])}"

    def _describe_answer(self, body: dict[str, Any]) -> str:
        if "voteGranted" in body:
            verdict = "granted" if body["voteGranted"] else f"refused ({body['reason']})"
            return f"vote {verdict}, term {int(body['term'])}"
        if "state" in body:
            hb = parse_heartbeat_reply(body)
            return (f"{hb.state.name}, term {hb.term}, applied {show_optime(hb.applied)}, commit point "
                    f"{show_optime(hb.commit_point)}, sync source {self._name(hb.sync_source) or 'none'}")
        if "prevSyncTarget" in body:
            return f"ok, the previous sync source was {self._name(body['prevSyncTarget']) or 'none'}"
        if "started" in body:
            return "standing" if body["started"] else "not electable"
        if "info" in body:
            return f"ok{', ' + body['info'] if body['info'] else ''}"
        return "ok" if body.get("ok") else f"error {body}"


# -- the file format ----------------------------------------------------------------------------------


def replay(text: str) -> str:
    """Runs every command of a transcript and returns the transcript with what the core did now."""
    driver = Driver()
    out: list[str] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        line = lines[i]
        if not line.strip() or line.startswith("#"):
            out.append(line)
            i += 1
            continue
        out.append(line)
        i += 1
        if i < len(lines) and lines[i] == "----":
            i += 1
            while i < len(lines) and lines[i].strip():
                i += 1
        out.append("----")
        try:
            out += driver.run(line)
        except MongoError as exc:  # the shell answers the request with this error
            out.append(f"raises MongoError {exc.code}: {exc}")
        except Exception as exc:  # shown in the transcript: a story that no longer runs is a difference
            out.append(f"error: {type(exc).__name__}: {exc}")
        if i >= len(lines) or lines[i].strip():
            out.append("")
    return "\n".join(out).rstrip("\n") + "\n"


@pytest.mark.parametrize("path", sorted(TRANSCRIPTS.glob("*.txt")), ids=lambda p: p.stem)
def test_transcript(path: Path) -> None:
    text = path.read_text()
    now = replay(text)
    if os.environ.get("REWRITE"):
        path.write_text(now)
        return
    assert now == text, f"{path.name} differs from what the core does now; review, then rewrite with REWRITE=1"


def test_there_are_transcripts_and_a_changed_answer_fails() -> None:
    paths = sorted(TRANSCRIPTS.glob("*.txt"))
    assert paths
    text = paths[0].read_text()
    _command, _sep, expected = text.partition("----\n")
    tampered = text.replace(expected.splitlines()[0], expected.splitlines()[0] + " (tampered)", 1)
    assert replay(tampered) != tampered
