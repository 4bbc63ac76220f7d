"""Helpers to run a real, throwaway rig node (tests, benchmarks, fault-injection scenarios)."""
