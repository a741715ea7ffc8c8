"""TLS for the wire port, the HTTP port and members' connections to each other (`--tlsMode`).

`requireTLS`: every connection to either port must be TLS; the member's certificate and key come
from `--tlsCertificateKeyFile` (one PEM file, as mongod's). With `--tlsCAFile`, a client that
presents a certificate must present one that CA signed (as mongod with
`--tlsAllowConnectionsWithoutCertificates`: drivers connect with `tls=true&tlsCAFile=...` and no
certificate of their own), and members verify each other's certificates (host names included)
against it, presenting their own. `disabled` (the default): no TLS. mongod's `allowTLS` and
`preferTLS` (both kinds of connection on one port) are refused: not supported.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass

DISABLED = "disabled"
REQUIRE = "requireTLS"
MODES = (DISABLED, REQUIRE)


class TlsConfigError(Exception):
    pass


@dataclass(frozen=True)
class TlsSettings:
    mode: str = DISABLED
    cert_key_file: str | None = None
    ca_file: str | None = None

    @property
    def on(self) -> bool:
        return self.mode == REQUIRE

    def check(self) -> None:
        if self.mode not in MODES:
            raise TlsConfigError(f"--tlsMode {self.mode} is not supported (use {' or '.join(MODES)})")
        if self.on and not self.cert_key_file:
            raise TlsConfigError("--tlsMode requireTLS needs --tlsCertificateKeyFile")

    def server_context(self) -> ssl.SSLContext | None:
        if not self.on:
            return None
        assert self.cert_key_file is not None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.cert_key_file)
        if self.ca_file:
            context.load_verify_locations(self.ca_file)
            context.verify_mode = ssl.CERT_OPTIONAL
        return context

    def client_context(self) -> ssl.SSLContext | None:
        """For this member's connections to the others: their certificates checked against the CA
        (or the system's), its own presented."""
        if not self.on:
            return None
        context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ca_file)
        if self.cert_key_file:
            context.load_cert_chain(self.cert_key_file)
        return context
