"""A set with TLS and keyfile auth for tests: throwaway certificates from a `trustme` CA, a keyfile,
and the first (root) user made through the localhost exception once the set is initiated."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trustme

from replset.auth.keyfile import write_keyfile
from tests.support.replica_set import ReplicaSet

USER, PASSWORD = "ops", "tls and auth"


def secure_options(directory: Path) -> tuple[list[str], dict[str, Any], str]:
    """(the member arguments, the client options, the CA file) for TLS with keyfile auth."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = trustme.CA()
    ca_file, pem_file, key_file = str(directory / "ca.pem"), str(directory / "member.pem"), str(directory / "keyfile")
    ca.cert_pem.write_to_path(ca_file)
    ca.issue_cert("127.0.0.1", "localhost").private_key_and_cert_chain_pem.write_to_path(pem_file)
    write_keyfile(key_file)
    args = ["--tlsMode", "requireTLS", "--tlsCertificateKeyFile", pem_file, "--tlsCAFile", ca_file,
            "--keyFile", key_file]
    return args, {"tls": True, "tlsCAFile": ca_file}, ca_file


def create_first_user(rs: ReplicaSet) -> None:
    """The root user, made on the primary while none exists; every member's clients log in from now on."""
    with rs.direct(rs.wait_primary()) as client:
        client.admin.command("createUser", USER, pwd=PASSWORD, roles=["root"])
    for m in rs.members:
        m.client_kwargs.update(username=USER, password=PASSWORD)
