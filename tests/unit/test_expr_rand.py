"""`$rand`: draws from the source the runtime installs, and takes no arguments."""

from __future__ import annotations

import datetime
import random

import pytest

from base.errors import MongoError
from oplog.expr_eval import install_random_source
from oplog.expressions import evaluate

NOW = datetime.datetime(2026, 1, 1)


def test_rand_draws_from_the_installed_source() -> None:
    install_random_source(random.Random(7).random)
    first = [evaluate({"$rand": {}}, {}, now=NOW) for _ in range(3)]
    install_random_source(random.Random(7).random)
    assert [evaluate({"$rand": {}}, {}, now=NOW) for _ in range(3)] == first
    assert all(0 <= x < 1 for x in first) and len(set(first)) == 3
    assert evaluate({"$multiply": [{"$rand": {}}, 0]}, {}, now=NOW) == 0


def test_rand_takes_no_arguments() -> None:
    with pytest.raises(MongoError):
        evaluate({"$rand": {"seed": 1}}, {}, now=NOW)
