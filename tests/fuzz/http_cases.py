"""HTTP fuzz cases for the member's status port: random paths and methods, garbage request
lines, huge and malformed headers. Each case is one request on its own connection; after a
malformed one the sender half-closes (a request cut short must not wait for more), so a
correct server answers (any status) or closes, never hangs. A well-formed GET of a status
page says `Connection: close` and must get 200.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

METHODS = ("GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "TRACE", "CONNECT", "PATCH", "BREW", "get", "",
           "G\x00T", "GET GET")
PATHS = ("/health", "/hello", "/replSetGetStatus", "/", "/nope", "//", "/health/", "/%00", "/%ff%fe",
         "/../../etc/passwd", "*", "http://x/health", "/hello?x=1&&&", "/" + "a" * 10_000, "/\u00e9",
         "/replSetGetStatus#frag", "")
VERSIONS = ("HTTP/1.1", "HTTP/1.0", "HTTP/2.0", "HTTP/9.9", "HTTP/1.1 extra", "", "http/1.1", "HTTP/1.")


@dataclass(frozen=True, slots=True)
class HttpCase:
    data: bytes
    must_succeed: bool  # a well-formed GET of a known status page: must get 200


def next_http_case(rng: random.Random) -> HttpCase:
    roll = rng.random()
    if roll < 0.15:
        path = rng.choice(("/health", "/hello", "/replSetGetStatus"))
        return HttpCase(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode(), True)
    if roll < 0.3:
        return HttpCase(rng.randbytes(rng.randint(0, 300)), False)
    line = f"{rng.choice(METHODS)} {rng.choice(PATHS)} {rng.choice(VERSIONS)}"
    headers = ["Host: x"] if rng.random() < 0.8 else []
    for _ in range(rng.randint(0, 4)):
        headers.append(rng.choice((
            "X-Big: " + "b" * rng.choice((100, 8_000, 9_000, 70_000)),
            "Content-Length: " + rng.choice(("0", "5", "-1", "abc", "99999999999", "1, 2")),
            "Transfer-Encoding: " + rng.choice(("chunked", "gzip", "bogus", "chunked, chunked")),
            "Connection: " + rng.choice(("close", "keep-alive", "upgrade")),
            "Upgrade: websocket", "Expect: 100-continue", ": no-name", "No-Colon", "X\x00Y: z",
            "X-Many: " + ",".join(["v"] * 1000), "Host: " + "h" * 5000,
        )))
    if rng.random() < 0.1:
        headers += [f"X-{i}: {i}" for i in range(rng.choice((100, 200, 1000)))]
    body = b""
    if rng.random() < 0.3:
        body = rng.randbytes(rng.randint(0, 200))
    ending = rng.choice(("\r\n\r\n", "\r\n\r\n", "\n\n", "\r\n", ""))
    text = line + "\r\n" + "\r\n".join(headers) + ending
    return HttpCase(text.encode("utf-8", "surrogateescape") + body, False)
