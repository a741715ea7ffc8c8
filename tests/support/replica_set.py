"""Real multi-member replica sets on loopback for integration tests."""

from __future__ import annotations

import json
import os
import signal
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from pymongo import MongoClient

from tests.support.members import Member, wait_for

FAST_SETTINGS = {"heartbeatIntervalMillis": 250, "electionTimeoutMillis": 2000}


@dataclass
class ReplicaSet:
    members: list[Member]
    name: str = "rs0"
    clients: list[MongoClient[dict[str, Any]]] = field(default_factory=list)

    @property
    def uri(self) -> str:
        return f"mongodb://{','.join(m.host for m in self.members)}/?replicaSet={self.name}"

    def start(self) -> None:
        """Starts every member at once, then waits until each accepts connections."""
        for m in self.members:
            m.launch()
        for m in self.members:
            m.wait_listening()

    def initiate(self, settings: dict[str, Any] | None = None, **member_options: dict[str, Any]) -> Member:
        """Initiates on the first member (which then wins the first election) and waits for the set."""
        config = {"_id": self.name, "settings": settings or FAST_SETTINGS, "members": [
            {"_id": i, "host": m.host, **member_options.get(f"m{i}", {})} for i, m in enumerate(self.members)]}
        self.direct(self.members[0]).admin.command("replSetInitiate", config)
        primary = self.wait_primary()
        for m in self.members:
            wait_for(lambda m=m: self.status(m)["myState"] in (1, 2, 7), 30, f"{m.host} to join the set")
        return primary

    def direct(self, member: Member) -> MongoClient[dict[str, Any]]:
        client = member.direct_client()
        self.clients.append(client)
        return client

    def client(self, **kwargs: Any) -> MongoClient[dict[str, Any]]:
        client: MongoClient[dict[str, Any]] = MongoClient(
            self.uri, serverSelectionTimeoutMS=10000, **{**self.members[0].client_kwargs, **kwargs})
        self.clients.append(client)
        return client

    def status(self, member: Member) -> dict[str, Any]:
        with member.direct_client() as c:
            return dict(c.admin.command("replSetGetStatus"))

    def http_status(self, member: Member) -> dict[str, Any]:
        url = f"http://127.0.0.1:{member.http_port}/replSetGetStatus"
        with urllib.request.urlopen(url, timeout=5) as resp:
            return dict(json.loads(resp.read()))

    def primary(self) -> Member | None:
        for m in self.members:
            if m.process is None or m.process.poll() is not None:
                continue
            try:
                with m.direct_client(serverSelectionTimeoutMS=1000) as c:
                    if c.admin.command("hello").get("isWritablePrimary"):
                        return m
            except Exception:
                continue
        return None

    def wait_primary(self, timeout_s: float = 30) -> Member:
        return wait_for(self.primary, timeout_s, "a primary")

    def sync_source(self, member: Member) -> str:
        return str(self.status(member).get("syncSourceHost", ""))

    def fail_point(self, member: Member, name: str, mode: Any, data: dict[str, Any] | None = None) -> None:
        cmd: dict[str, Any] = {"configureFailPoint": name, "mode": mode}
        if data is not None:
            cmd["data"] = data
        self.direct(member).admin.command(cmd)

    def check_stalled_tail(self, tail: Member, coll: Any, *, all_members: int, wtimeout_ms: int) -> None:
        """With `tail` no longer fetching, w:all times out while w:all-1 succeeds; once it resumes,
        w:all succeeds again (acknowledgements from the end of a chain travel upstream)."""
        from pymongo import WriteConcern
        from pymongo.errors import WTimeoutError

        self.fail_point(tail, "stopReplProducer", "alwaysOn")
        try:
            try:
                coll.with_options(write_concern=WriteConcern(w=all_members, wtimeout=wtimeout_ms)).insert_one(
                    {"_id": "stalled"})
            except WTimeoutError:
                pass
            else:
                raise AssertionError(f"w:{all_members} was acknowledged while {tail.host} was stopped")
            coll.with_options(write_concern=WriteConcern(w=all_members - 1, wtimeout=5000)).insert_one(
                {"_id": f"w{all_members - 1}"})
        finally:
            self.fail_point(tail, "stopReplProducer", "off")
        coll.with_options(write_concern=WriteConcern(w=all_members, wtimeout=5000)).insert_one({"_id": "resumed"})

    def add_member(self, member: Member, **options: Any) -> None:
        """Adds a started member to the config through the primary (`replSetReconfig`, version + 1)."""
        primary = self.wait_primary()
        config = self.direct(primary).admin.command("replSetGetConfig")["config"]
        config["members"].append({"_id": max(m["_id"] for m in config["members"]) + 1, "host": member.host,
                                  **options})
        config["version"] += 1
        self.direct(primary).admin.command("replSetReconfig", config)
        self.members.append(member)

    def wait_state(self, member: Member, state: int, timeout_s: float = 30) -> dict[str, Any]:
        """Waits until `member` reports `state` (its own myState); returns that status document."""
        def reached() -> dict[str, Any] | None:
            status = self.status(member)
            return status if status["myState"] == state else None

        return wait_for(reached, timeout_s, f"{member.host} to reach state {state}")

    def pause(self, member: Member) -> None:
        assert member.process is not None
        member.process.send_signal(signal.SIGSTOP)

    def resume(self, member: Member) -> None:
        assert member.process is not None
        member.process.send_signal(signal.SIGCONT)

    def stop(self) -> None:
        for c in self.clients:
            c.close()
        for m in self.members:  # every member is asked to stop at once, then each is waited for
            if m.process is not None and m.process.poll() is None:
                os.kill(m.process.pid, signal.SIGCONT)
                m.process.terminate()
        for m in self.members:
            m.stop()


def make_replica_set(base_dir: str, n: int, *, test_commands: bool = True,
                     extra_args: tuple[str, ...] = ()) -> ReplicaSet:
    extra = (["--enableTestCommands"] if test_commands else []) + list(extra_args)
    return ReplicaSet([Member(dbpath=os.path.join(base_dir, f"m{i}"), extra_args=list(extra)) for i in range(n)])


def running_set(base_dir: str, extra_args: tuple[str, ...] = ()) -> Iterator[ReplicaSet]:
    """An initiated three-member set for as long as the generator runs (a fixture's body)."""
    s = make_replica_set(base_dir, 3, extra_args=extra_args)
    try:
        s.start()
        s.initiate()
        yield s
    finally:
        s.stop()
