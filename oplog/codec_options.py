"""How stored and wire BSON decodes: plain dicts, binary subtype 4 kept as Binary."""

from __future__ import annotations

__layer__ = "core"  # pure: no I/O, clock or randomness (tests/unit/test_layering.py)

from typing import Any

from bson.codec_options import CodecOptions

DOC_OPTIONS: CodecOptions[dict[str, Any]] = CodecOptions(document_class=dict)
