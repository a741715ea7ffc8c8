"""`--partsStorage` URLs and the keys of parts in shared storage."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from base.errors import MongoError
from oplog.parts.storage_url import StorageLocation, content_checksum, parse_storage_url, part_key, redact_url

UUID = "0f8fad5b-d9cb-469f-a165-70867728950e"


def test_a_file_url_names_an_absolute_directory() -> None:
    assert parse_storage_url("file:///srv/parts/") == StorageLocation("file", "/srv/parts")
    assert parse_storage_url("file://localhost/srv/parts").root == "/srv/parts"
    for bad in ("file://otherhost/srv", "file:relative/dir", "file:///srv/../etc", "file:///srv?x=1"):
        with pytest.raises(MongoError) as err:
            parse_storage_url(bad)
        assert err.value.code == 2


def test_an_s3_url_names_a_bucket_a_prefix_an_endpoint_and_a_region() -> None:
    loc = parse_storage_url("s3://bucket/some/prefix/?endpoint=http://127.0.0.1:9000&region=eu-west-1")
    assert loc == StorageLocation("s3", "bucket/some/prefix", "127.0.0.1:9000", "http", "eu-west-1")
    assert loc.url == "s3://bucket/some/prefix?endpoint=http://127.0.0.1:9000&region=eu-west-1"
    assert parse_storage_url("s3://bucket") == StorageLocation("s3", "bucket")


@pytest.mark.parametrize("bad", [
    "s3://key:secret@bucket/p",            # credentials never in the URL
    "s3:///no-bucket",
    "s3://bucket/p?endpoint=ftp://h:1",
    "s3://bucket/p?endpoint=http://h:1/path",
    "s3://bucket/p?acl=public",            # an unknown option is refused, not ignored
    "s3://bucket/a//b",
    "s3://bucket/a/../b",
    "gs://bucket/p",
    "/plain/path",
    "s3://bucket/p?endpoint=http://[::1",  # not a URL at all: BadValue too, not a ValueError
    "s3://bucket/p?secret=hunter2",
    "s3://[bucket/p",
])
def test_anything_else_is_bad_value_saying_why(bad: str) -> None:
    with pytest.raises(MongoError) as err:
        parse_storage_url(bad)
    assert err.value.code == 2 and "partsStorage" in err.value.errmsg
    assert "secret@" not in err.value.errmsg and "hunter2" not in err.value.errmsg   # shown redacted


@pytest.mark.parametrize(("url", "shown"), [
    ("file:///srv/parts", "file:///srv/parts"),
    ("s3://bucket/p?endpoint=http://127.0.0.1:9000&region=r", "s3://bucket/p?endpoint=http://127.0.0.1:9000&region=r"),
    ("s3://bucket/p?endpoint=http://user:secret@127.0.0.1:9000&region=r",
     "s3://bucket/p?endpoint=http://***@127.0.0.1:9000&region=r"),
    ("s3://bucket/p?endpoint=http%3A%2F%2Fuser%3Asecret%40h%3A1", "s3://bucket/p?endpoint=http://***@h:1"),
    ("s3://key:secret@bucket/p", "s3://***@bucket/p"),
    ("https://user@host/p?X-Amz-Signature=abc&token=t&Password=p&x=1",
     "https://***@host/p?X-Amz-Signature=***&token=***&Password=***&x=1"),
    ("s3://bucket/p?aws_secret_access_key=abc&endpoint=user:pw@h:1", "s3://bucket/p?aws_secret_access_key=***&endpoint=***@h:1"),
    ("http://[::1", "***"),
])
def test_a_url_is_shown_without_its_credentials(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_a_location_shows_no_credentials_but_keeps_them_for_the_client() -> None:
    loc = parse_storage_url("s3://bucket/p?endpoint=http://user:secret@127.0.0.1:9000")
    assert loc.endpoint == "user:secret@127.0.0.1:9000"   # what the S3 client is given
    assert loc.url == "s3://bucket/p?endpoint=http://***@127.0.0.1:9000"
    assert loc.hide("Could not resolve host: user:secret@127.0.0.1 (secret)") == \
        "Could not resolve host: ***@127.0.0.1 (***)"


_PASSWORD_CHARS = st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="/?#&=%[]\\")


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=_PASSWORD_CHARS, min_size=1, max_size=16),
       st.sampled_from([("s3://u:{}@b/p", "s3://***@b/p"),
                        ("s3://b/p?endpoint=http://u:{}@h:1&region=r", "s3://b/p?endpoint=http://***@h:1&region=r"),
                        ("s3://b/p?secret_key={}", "s3://b/p?secret_key=***"),
                        ("https://h/p?token={}&a=b", "https://h/p?token=***&a=b")]))
def test_a_secret_never_survives_redaction(secret: str, template: tuple[str, str]) -> None:
    assert redact_url(template[0].format(secret)) == template[1]


def test_a_part_key_is_the_table_the_partition_and_the_content() -> None:
    a = {"data.parquet": (10, "aa"), "columns.txt": (5, "cc")}
    b = {"data.parquet": (10, "ab"), "columns.txt": (5, "cc")}
    assert content_checksum(a) != content_checksum(b) and len(content_checksum(a)) == 32
    assert content_checksum(dict(reversed(list(a.items())))) == content_checksum(a)   # order does not matter
    assert part_key(UUID, "202401", a) == f"{UUID}/202401_{content_checksum(a)}"
    for table, partition, checksums in ((UUID, "../x", a), (UUID, "a/b", a), ("not-a-uuid", "p", a), (UUID, "p", {})):
        with pytest.raises(MongoError):
            part_key(table, partition, checksums)
