"""A crash oracle for one broker's storage that does not trust the broker.

:mod:`~stratalog.faults.crash_oracle.recorder` is a pass-through FUSE file system that logs
what the kernel asks of it (:mod:`~stratalog.faults.crash_oracle.oplog`); the broker's data
directory is mounted on it. :mod:`~stratalog.faults.crash_oracle.durability` replays a prefix
of that log under strict POSIX rules and writes the image a power cut there may leave.
tests/test_crash_oracle.py recovers such images and checks every acknowledged record against
them; docs/architecture.md (storage failure model) says what it checks and what it cannot see.
The product never imports it.
"""
