"""Data layer: oplog entries, idempotent rewrite of writes, query/update semantics, storage."""
