"""Where each member's HTTP port answers (part files), learned from the member itself.

A member fetches part files over HTTP and, with a keyfile, proves itself with the members' token.
So the address it connects to must be a member's: never one a client message or a replicated
document names. Each member's heartbeat replies say its HTTP port (`httpPort`); the host is
the member's host in the current config. A member not in the config, or one that has not said
its port yet, has no address: nothing is fetched from it. Pure: no I/O.
"""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from collections.abc import Iterable
from typing import Any

HTTP_PORT_FIELD = "httpPort"  # in replSetHeartbeat replies


def parse_http_port(value: Any) -> int | None:
    """A port from a peer's reply, or None when it is not a valid TCP port."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        return None
    return int(value)


class MemberHttp:
    def __init__(self, me: str, my_http_port: int) -> None:
        self._ports: dict[str, int] = {me: my_http_port}

    def learn(self, host: str, port: Any) -> None:
        """A heartbeat reply from `host` (a member of the config) carried `port`."""
        parsed = parse_http_port(port)
        if parsed is not None:
            self._ports[host] = parsed

    def address(self, host: str, members: Iterable[str]) -> str | None:
        """`host:httpPort` of the member `host`, or None if it is not in `members` (the config's hosts)
        or its port is not known."""
        port = self._ports.get(host)
        if port is None or host not in set(members):
            return None
        return f"{host.rpartition(':')[0]}:{port}"
