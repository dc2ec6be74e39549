"""The soak runs on the three-broker cluster of ``tests/cluster`` (its fixture)."""

from tests.cluster.conftest import cluster

__all__ = ["cluster"]
