"""The set's vocabulary, below every other layer: optimes, MongoDB errors, member states, the
replica set config, the wire codec and the replication messages members exchange (hello,
heartbeats, votes, position reports). Imports nothing else of the project."""
