"""Deterministic simulation of the replica set: every member's decision cores in one process,
driven by one seed (see `tests.sim.runner`)."""
