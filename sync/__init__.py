"""Replication: sync source selection, oplog fetching, applying, position reporting."""
