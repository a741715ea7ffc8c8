from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.members import Member


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
