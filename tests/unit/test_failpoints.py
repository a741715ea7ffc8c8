"""Test-only fault hooks (replset/failpoints.py): modes, counting down, per-host latency."""

from __future__ import annotations

from typing import Any

import pytest

from base.errors import MongoError
from replset.failpoints import FailPoints

S1, S2 = "s1:27017", "s2:27017"


def code_of(points: FailPoints, name: str, mode: Any, data: Any = None) -> int:
    with pytest.raises(MongoError) as excinfo:
        points.configure(name, mode, data)
    return excinfo.value.code


# --- modes ---------------------------------------------------------------------------------------------


def test_nothing_is_on_at_first() -> None:
    points = FailPoints()
    assert not points.is_on("stopReplProducer") and points.check("stopReplProducer") is None
    assert points.latency_ms(S1) == 0.0 and points.changed == 0


def test_always_on_fires_on_every_check_until_turned_off() -> None:
    points = FailPoints()
    assert points.configure("stopReplProducer", "alwaysOn", None) == 0
    for _ in range(5):
        assert points.check("stopReplProducer") is not None
    assert points.is_on("stopReplProducer")
    points.configure("stopReplProducer", "off", None)
    assert not points.is_on("stopReplProducer") and points.check("stopReplProducer") is None


def test_times_n_fires_for_the_next_n_checks_only() -> None:
    points = FailPoints()
    points.configure("stopReplProducer", {"times": 3}, None)
    assert [points.check("stopReplProducer") is not None for _ in range(5)] == [True, True, True, False, False]
    assert not points.is_on("stopReplProducer")


def test_is_on_does_not_use_up_a_times_fail_point() -> None:
    points = FailPoints()
    points.configure("stopReplProducer", {"times": 1}, None)
    assert points.is_on("stopReplProducer") and points.is_on("stopReplProducer")
    assert points.check("stopReplProducer") is not None
    assert not points.is_on("stopReplProducer")


def test_check_hands_back_the_data() -> None:
    points = FailPoints()
    points.configure("peerLatency", "alwaysOn", {"host": S1, "delayMs": 40})
    point = points.check("peerLatency")
    assert point is not None and point.data == {"host": S1, "delayMs": 40} and point.times is None


def test_reconfiguring_replaces_the_mode() -> None:
    points = FailPoints()
    points.configure("stopReplProducer", {"times": 1}, None)
    points.configure("stopReplProducer", "alwaysOn", None)
    points.check("stopReplProducer")
    assert points.is_on("stopReplProducer")


def test_turning_off_a_fail_point_that_is_off_is_fine() -> None:
    points = FailPoints()
    assert points.configure("peerLatency", "off", None) == 0
    assert not points.is_on("peerLatency")


def test_fail_points_are_independent() -> None:
    points = FailPoints()
    points.configure("stopReplProducer", "alwaysOn", None)
    assert not points.is_on("peerLatency") and points.check("peerLatency") is None


def test_each_change_is_counted() -> None:
    points = FailPoints()
    points.configure("stopReplProducer", "alwaysOn", None)
    points.configure("stopReplProducer", "off", None)
    with pytest.raises(MongoError):
        points.configure("stopReplProducer", "sometimes", None)
    assert points.changed == 2


# --- errors are BadValue (2) -------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["noSuchFailPoint", "", "rsSyncApplyStop"])
def test_unknown_fail_points_are_bad_value(name: str) -> None:
    assert code_of(FailPoints(), name, "alwaysOn") == 2


@pytest.mark.parametrize(
    "mode",
    ["on", "sometimes", None, 1, ["alwaysOn"], {}, {"times": 0}, {"times": -2}, {"times": "3"},
     {"skip": -1}],
)
def test_bad_modes_are_bad_value(mode: Any) -> None:
    assert code_of(FailPoints(), "stopReplProducer", mode) == 2


@pytest.mark.parametrize("data", ["s1:27017", 5, [S1]])
def test_data_that_is_not_an_object_is_bad_value(data: Any) -> None:
    assert code_of(FailPoints(), "peerLatency", "alwaysOn", data) == 2


def test_a_rejected_configure_leaves_the_fail_point_as_it_was() -> None:
    points = FailPoints()
    points.configure("peerLatency", "alwaysOn", {"host": S1, "delayMs": 40})
    code_of(points, "peerLatency", {"times": 0}, {"host": S2, "delayMs": 1})
    assert points.latency_ms(S1) == 40.0 and points.latency_ms(S2) == 0.0


# --- peer latency ------------------------------------------------------------------------------------------


def test_latency_applies_only_to_the_named_host() -> None:
    points = FailPoints()
    points.configure("peerLatency", "alwaysOn", {"host": S1, "delayMs": 40})
    assert points.latency_ms(S1) == 40.0 and points.latency_ms(S2) == 0.0


def test_latency_applies_to_each_listed_host() -> None:
    points = FailPoints()
    points.configure("peerLatency", "alwaysOn", {"hosts": [S1, S2], "delayMs": 15})
    assert (points.latency_ms(S1), points.latency_ms(S2), points.latency_ms("p:27017")) == (15.0, 15.0, 0.0)


def test_latency_host_matching_ignores_case() -> None:
    points = FailPoints()
    points.configure("peerLatency", "alwaysOn", {"host": "S1:27017", "delayMs": 40})
    assert points.latency_ms("s1:27017") == 40.0 and points.latency_ms("S1:27017") == 40.0
    points.configure("peerLatency", "alwaysOn", {"hosts": ["s2:27017"], "delayMs": 5})
    assert points.latency_ms("S2:27017") == 5.0


def test_latency_without_delay_is_zero() -> None:
    points = FailPoints()
    points.configure("peerLatency", "alwaysOn", {"host": S1})
    assert points.latency_ms(S1) == 0.0


def test_latency_ends_when_the_fail_point_is_turned_off() -> None:
    points = FailPoints()
    points.configure("peerLatency", "alwaysOn", {"host": S1, "delayMs": 40})
    points.configure("peerLatency", "off", None)
    assert points.latency_ms(S1) == 0.0


def test_stop_repl_producer_adds_no_latency() -> None:
    points = FailPoints()
    points.configure("stopReplProducer", "alwaysOn", {"host": S1, "delayMs": 40})
    assert points.latency_ms(S1) == 0.0


@pytest.mark.parametrize("data", [{"hosts": 5, "delayMs": 10}, {"host": S1, "delayMs": "slow"},
                                  {"host": S1, "delayMs": [10]}])
def test_peer_latency_data_latency_ms_cannot_use_is_rejected_up_front(data: dict[str, Any]) -> None:
    points = FailPoints()
    try:
        points.configure("peerLatency", "alwaysOn", data)
    except MongoError as exc:
        assert exc.code == 2
        return
    assert isinstance(points.latency_ms(S1), float)


# --- peer routes -------------------------------------------------------------------------------------------

PROXY = "127.0.0.1:40001"


def test_without_routes_a_peer_is_dialled_by_its_own_name() -> None:
    assert FailPoints().peer_route(S1) == S1


def test_a_route_redirects_only_the_named_peer() -> None:
    points = FailPoints()
    points.configure("peerRoutes", "alwaysOn", {"routes": {S1: PROXY}})
    assert points.peer_route(S1) == PROXY and points.peer_route(S2) == S2


def test_route_matching_ignores_case() -> None:
    points = FailPoints()
    points.configure("peerRoutes", "alwaysOn", {"routes": {"S1:27017": PROXY}})
    assert points.peer_route("s1:27017") == PROXY


def test_reconfiguring_routes_replaces_them_and_off_removes_them() -> None:
    points = FailPoints()
    points.configure("peerRoutes", "alwaysOn", {"routes": {S1: PROXY, S2: "127.0.0.1:40002"}})
    points.configure("peerRoutes", "alwaysOn", {"routes": {S2: PROXY}})
    assert (points.peer_route(S1), points.peer_route(S2)) == (S1, PROXY)
    points.configure("peerRoutes", "off", None)
    assert points.peer_route(S2) == S2


def test_routes_add_no_latency_and_latency_adds_no_routes() -> None:
    points = FailPoints()
    points.configure("peerRoutes", "alwaysOn", {"routes": {S1: PROXY}})
    points.configure("peerLatency", "alwaysOn", {"host": S1, "delayMs": 5})
    assert points.latency_ms(S1) == 5.0 and points.peer_route(S1) == PROXY
    points.configure("peerLatency", "off", None)
    assert points.peer_route(S1) == PROXY


@pytest.mark.parametrize("data", [None, {}, {"routes": [S1, PROXY]}, {"routes": {S1: 40001}},
                                  {"routes": {S1: "127.0.0.1"}}, {"routes": {"s1": PROXY}},
                                  {"routes": {S1: "127.0.0.1:0"}}, {"routes": {S1: "127.0.0.1:99999"}},
                                  {"routes": {S1: ":40001"}}])
def test_bad_routes_are_bad_value_and_change_nothing(data: Any) -> None:
    points = FailPoints()
    points.configure("peerRoutes", "alwaysOn", {"routes": {S1: PROXY}})
    assert code_of(points, "peerRoutes", "alwaysOn", data) == 2
    assert points.peer_route(S1) == PROXY


# --- failCommand ------------------------------------------------------------------------------------------
def test_fail_command_fires_only_for_its_commands_and_counts_only_them() -> None:
    points = FailPoints()
    points.configure("failCommand", {"times": 2}, {"failCommands": ["insert"], "errorCode": 91})
    assert points.command_failure("find", "db.c", None, internal=False) is None
    assert points.command_failure("insert", "db.c", None, internal=False) == {
        "failCommands": ["insert"], "errorCode": 91}
    assert points.command_failure("insert", "db.c", None, internal=False) is not None
    assert points.command_failure("insert", "db.c", None, internal=False) is None  # used up


def test_fail_command_skip_lets_the_first_ones_pass() -> None:
    points = FailPoints()
    points.configure("failCommand", {"skip": 1}, {"failCommands": ["find"], "closeConnection": True})
    assert points.command_failure("find", "db.c", None, internal=False) is None
    assert points.command_failure("find", "db.c", None, internal=False) is not None
    assert points.command_failure("find", "db.c", None, internal=False) is not None


def test_fail_command_spares_members_other_apps_and_namespaces() -> None:
    points = FailPoints()
    points.configure("failCommand", "alwaysOn", {"failCommands": ["find"], "errorCode": 2, "appName": "app",
                                                 "namespace": "db.c"})
    assert points.command_failure("find", "db.c", "other", internal=False) is None
    assert points.command_failure("find", "db.d", "app", internal=False) is None
    assert points.command_failure("find", "db.c", "app", internal=True) is None
    assert points.command_failure("find", "db.c", "app", internal=False) is not None


@pytest.mark.parametrize("data", [{}, {"failCommands": "insert"}, {"failCommands": ["x"], "errorCode": "1"},
                                  {"failCommands": ["x"], "errorLabels": "L"},
                                  {"failCommands": ["x"], "blockConnection": True, "blockTimeMS": -1},
                                  {"failCommands": ["x"], "writeConcernError": {"errmsg": "no code"}}])
def test_bad_fail_command_data_is_bad_value(data: dict[str, Any]) -> None:
    assert code_of(FailPoints(), "failCommand", "alwaysOn", data) == 2
