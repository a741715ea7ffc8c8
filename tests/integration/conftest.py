from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from pymongo import MongoClient

from tests.support.members import Member
from tests.support.replica_set import ReplicaSet, running_set


@pytest.fixture(scope="module")
def member(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Member]:
    """One initiated one-member set, shared by a test module."""
    m = Member(dbpath=str(tmp_path_factory.mktemp("member")))
    m.start()
    try:
        m.initiate()
        yield m
    finally:
        m.stop()


@pytest.fixture()
def start_member(tmp_path: Any) -> Iterator[Callable[..., Member]]:
    """Starts members of the test's own (initiated unless told otherwise); stops them all afterwards."""
    started: list[Member] = []

    def start(*extra_args: str, initiate: bool = True) -> Member:
        m = Member(dbpath=str(tmp_path / f"db{len(started)}"), extra_args=list(extra_args))
        started.append(m)
        m.start()
        if initiate:
            m.initiate()
        return m

    try:
        yield start
    finally:
        for m in started:
            m.stop()


@pytest.fixture(scope="module")
def rs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicaSet]:
    """An initiated three-member set (test fail points enabled), shared by a test module."""
    yield from running_set(str(tmp_path_factory.mktemp("rs3")))


@pytest.fixture()
def rs3(tmp_path: Any) -> Iterator[ReplicaSet]:
    """An initiated three-member set of the test's own (it may kill or partition members)."""
    yield from running_set(str(tmp_path))


@pytest.fixture(scope="module")
def set_client(rs: ReplicaSet) -> Iterator[MongoClient[dict[str, Any]]]:
    """A client of the module's set whose writes wait for every member (w: 3)."""
    with rs.client(w=3) as c:
        yield c


@pytest.fixture()
def fresh_db(set_client: MongoClient[dict[str, Any]], request: pytest.FixtureRequest) -> Any:
    """A database of the test's own on the module's set, dropped first."""
    name = "t_" + request.node.name.replace("[", "_").replace("]", "_")[:50]
    set_client.drop_database(name)
    return set_client[name]
