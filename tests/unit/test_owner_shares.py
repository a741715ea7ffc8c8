"""Fair shares: the owner past its share (or past the total) is refused and nobody else loses anything;
what is only remembered goes from its own owner first, then from whoever keeps most."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from base.errors import MongoError
from replset.owner_shares import Remembered, Shares


def test_the_owner_past_its_share_is_refused_and_others_go_on() -> None:
    shares = Shares("open cursors", "maxOpenCursorsPerUser", per_owner=2, total=5)
    shares.take("read@A")
    shares.take("read@A")
    with pytest.raises(MongoError) as refused:
        shares.take("read@A")
    assert refused.value.code == 96
    assert "read@A holds 2 open cursors" in refused.value.errmsg and "maxOpenCursorsPerUser: 2" in refused.value.errmsg
    shares.take("root@admin")  # another owner is not refused, and nothing of read@A's went
    assert (shares.held("read@A"), shares.held("root@admin"), len(shares)) == (2, 1, 3)
    shares.give_back("read@A")
    shares.take("read@A")  # a place given back is free again at once
    shares.per_owner = 3  # (an operator's setParameter)
    shares.take("read@A")
    assert shares.held("read@A") == 3


def test_the_total_refuses_the_next_one_whoever_asks() -> None:
    shares = Shares("open transactions", "maxOpenTransactionsPerUser", per_owner=10, total=3, code=96)
    for owner in ("a@x", "b@x", "c@x"):
        shares.take(owner)
    error = shares.refusal("d@x")
    assert error is not None and "its bound for all users together (3)" in error.errmsg
    shares.add("d@x")  # (what exists already is counted, never refused)
    assert len(shares) == 4
    shares.give_back("d@x")
    shares.give_back("a@x")
    assert shares.refusal("d@x") is None


def test_giving_back_what_was_not_taken_is_an_error() -> None:
    shares = Shares("sessions", "sessions", per_owner=1, total=1, code=261)
    with pytest.raises(ValueError, match="holds none"):
        shares.give_back("nobody@x")
    shares.add("")
    error = shares.refusal("")
    assert error is not None and error.code == 261 and "access control is off" in error.errmsg
    shares.clear()
    assert len(shares) == 0 and shares.held("") == 0


def test_remembered_forgets_the_owners_own_oldest_first() -> None:
    kept: Remembered[str] = Remembered(per_owner=2, total=10)
    assert kept.add("a", "a1") == [] and kept.add("a", "a2") == [] and kept.add("b", "b1") == []
    assert kept.add("a", "a3") == ["a1"]  # a's own oldest, never b's
    assert kept.add("a", "a2") == []  # (again: now its newest)
    assert kept.add("a", "a4") == ["a3"]
    kept.discard("a", "a2")
    kept.discard("a", "gone")
    assert len(kept) == 2


def test_past_the_total_whoever_keeps_most_pays() -> None:
    kept: Remembered[str] = Remembered(per_owner=10, total=5)
    kept.add("small", "s1")
    for key in ("b1", "b2", "b3", "b4"):
        kept.add("big", key)
    assert kept.add("small", "s2") == ["b1"]
    assert kept.add("other", "o1") == ["b2"]  # big still keeps most (3, small 2, other 1)
    assert len(kept) == 5


@given(st.lists(st.tuples(st.sampled_from("abcd"), st.integers(0, 12)), max_size=80),
       st.integers(1, 5), st.integers(1, 12))
def test_remembered_stays_within_its_bounds(adds: list[tuple[str, int]], per_owner: int, total: int) -> None:
    kept: Remembered[tuple[str, int]] = Remembered(per_owner=per_owner, total=total)
    model: dict[str, list[tuple[str, int]]] = {}
    for owner, n in adds:
        key = (owner, n)
        before = {o: len(keys) for o, keys in model.items()}
        forgotten = kept.add(owner, key)
        keys = model.setdefault(owner, [])
        if key in keys:
            keys.remove(key)
        keys.append(key)
        for gone in forgotten:
            # Only the owner that added, or one keeping the most, loses a key: its oldest.
            assert gone[0] == owner or before.get(gone[0], 0) >= max(before.values())
            assert model[gone[0]][0] == gone
            model[gone[0]].pop(0)
        assert key not in forgotten or per_owner == 0
        assert all(len(keys) <= per_owner for keys in model.values())
        assert len(kept) == sum(map(len, model.values())) <= total
