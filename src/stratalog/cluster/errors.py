"""Errors of cluster mode."""

from __future__ import annotations


class ClusterError(Exception):
    """The cluster's metadata store (etcd) failed or cannot be reached."""
