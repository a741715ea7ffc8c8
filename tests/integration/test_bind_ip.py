"""`--bind_ip` (a comma-separated list) and `--bind_ip_all`, as mongod's: what the ports listen on,
read from the kernel's socket table (no traffic leaves the loopback interface)."""

from __future__ import annotations

from pathlib import Path

from tests.support.members import Member


def _listening_addresses(port: int) -> set[str]:
    """The local addresses of listening TCP sockets on `port` (IPv4 and IPv6), as hex from /proc."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            local, state = line.split()[1], line.split()[3]
            address, _, hex_port = local.rpartition(":")
            if state == "0A" and int(hex_port, 16) == port:  # 0A: LISTEN
                found.add(address)
    return found


def test_bind_ip_all_listens_everywhere_and_a_list_on_each_address(tmp_path: Path) -> None:
    everywhere = Member(dbpath=str(tmp_path / "all"), extra_args=["--bind_ip_all"])
    listed = Member(dbpath=str(tmp_path / "listed"), extra_args=["--bind_ip", "127.0.0.1,127.0.0.2"])
    try:
        everywhere.start()
        listed.start()
        for member in (everywhere, listed):
            with member.direct_client() as client:
                assert client.admin.command("ping")["ok"] == 1
        wide = _listening_addresses(everywhere.port)
        assert wide & {"00000000", "00000000000000000000000000000000"}, wide  # 0.0.0.0 or ::
        assert "00000000" in _listening_addresses(everywhere.http_port) or \
            "00000000000000000000000000000000" in _listening_addresses(everywhere.http_port)
        narrow = _listening_addresses(listed.port)
        assert {"0100007F", "0200007F"} <= narrow and "00000000" not in narrow  # 127.0.0.1 and .2, no more
        with everywhere.direct_client() as client:
            assert client.admin.command("getCmdLineOpts")["parsed"]["net"]["bindIpAll"] is True
    finally:
        everywhere.stop()
        listed.stop()
