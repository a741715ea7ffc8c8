"""Where part files are fetched from: only members of the config, at the port they said themselves."""

from __future__ import annotations

import pytest

from replset.member_http import MemberHttp, parse_http_port

MEMBERS = ("127.0.0.1:27017", "127.0.0.1:27018")


def test_only_config_members_that_said_their_port_have_an_address() -> None:
    http = MemberHttp("127.0.0.1:27017", 28017)
    assert http.address("127.0.0.1:27017", MEMBERS) == "127.0.0.1:28017"
    assert http.address("127.0.0.1:27018", MEMBERS) is None  # no heartbeat reply yet
    http.learn("127.0.0.1:27018", 39000)
    assert http.address("127.0.0.1:27018", MEMBERS) == "127.0.0.1:39000"
    http.learn("10.0.0.9:27017", 80)
    assert http.address("10.0.0.9:27017", MEMBERS) is None  # not in the config
    assert http.address("127.0.0.1:27018", MEMBERS[:1]) is None  # removed by a reconfig


@pytest.mark.parametrize("value", [0, -1, 65536, 2**63 - 1, 1.5, float("nan"), True, "28017", None])
def test_a_port_that_is_no_tcp_port_is_ignored(value: object) -> None:
    assert parse_http_port(value) is None
    http = MemberHttp("a:1", 2)
    http.learn("b:1", value)
    assert http.address("b:1", ("a:1", "b:1")) is None
