"""The integration tests' node: see rig.testing.harness."""

from rig.testing.harness import RigHarness, delete_prefix

__all__ = ["RigHarness", "delete_prefix"]
