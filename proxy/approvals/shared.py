"""Approvals in Redis, for several replicas (SPEC §5.5a, §8). Filled in below."""
