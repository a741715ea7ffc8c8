"""mongosh and the MongoDB Node.js driver, as `make install` puts them under build/node."""

from __future__ import annotations

import json
import os
import subprocess
from typing import Any

from tests.support.members import REPO_ROOT

NODE_MODULES = os.path.join(REPO_ROOT, "build", "node", "node_modules")
MONGOSH = os.path.join(NODE_MODULES, ".bin", "mongosh")


def mongosh(uri: str, script: str) -> subprocess.CompletedProcess[str]:
    """Runs `script` in mongosh against `uri` (fails the test if mongosh is not installed)."""
    assert os.path.exists(MONGOSH), "mongosh is missing: run `make install` (it needs node and npm)"
    return subprocess.run([MONGOSH, uri, "--quiet", "--norc", "--eval", script],
                          capture_output=True, text=True, timeout=60)


def mongosh_logged_in_users(uri: str) -> list[Any]:
    """The users mongosh's connection to `uri` is authenticated as (`connectionStatus`)."""
    done = mongosh(uri, "JSON.stringify(db.runCommand({connectionStatus: 1}).authInfo.authenticatedUsers)")
    assert done.returncode == 0, done.stderr
    users = json.loads(done.stdout.strip().splitlines()[-1])
    assert isinstance(users, list)
    return users
