"""replset: a MongoDB-compatible oplog replica set."""

__version__ = "7.0.0"
