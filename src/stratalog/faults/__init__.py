"""A Jepsen-style fault-injection lab for replicated Kafka-compatible clusters (ours, and Apache
Kafka as the baseline). Nothing in the product imports it.

The ideas are jepsen.tests.kafka's (replication-facts.md §2 and §7), the code our own:

* :mod:`~stratalog.faults.workload` - idempotent ``acks=all`` producers (unique values, rate
  limited) and ``assign`` and ``subscribe`` consumers polling concurrently on 127.0.0.1, then
  the final reads of every partition from offset 0;
* :mod:`~stratalog.faults.history` - what they saw, as JSONL invoke/ok/fail/info events (a send
  whose outcome is unknown is ``info``, never ``fail``);
* :mod:`~stratalog.faults.nemesis` - a seeded schedule of ``kill -9`` (one or two brokers),
  ``SIGSTOP`` past the 3 s lease, and ``kill -9`` / ``SIGSTOP`` of the coordinator (etcd; on
  Kafka the active KRaft controller), all by PID, and network cuts (one leader from etcd, one
  from its peers), with fault-free gaps and a final heal;
* :mod:`~stratalog.faults.proxy` - the loopback TCP fault proxy those cuts go through;
* :mod:`~stratalog.faults.checker` - lost writes, unseen, duplicates, inconsistent offsets,
  nonmonotonic sends, nonmonotonic and skipping polls, G1a, phantoms; from the history alone;
* :mod:`~stratalog.faults.targets` - the systems under test behind one interface: Stratalog's
  :class:`~stratalog.cluster.local_cluster.LocalCluster` and a three-node Kafka 4.x KRaft
  cluster (:class:`~stratalog.peers.kafka_cluster.KafkaCluster`);
* :mod:`~stratalog.faults.runner` - one run, start to verdict; :mod:`~stratalog.faults.report`
  - the results table;
* :mod:`~stratalog.faults.crash_oracle` - one broker's storage under power cuts, judged from the
  kernel's requests to a recording FUSE mount (tests/test_crash_oracle.py).

``make test`` runs a short mix (``-m faults``: tests/cluster/faults/). The long soak::

    python -m stratalog.faults soak --target stratalog --runs 50 --duration 300
    python -m stratalog.faults soak --target kafka --runs 10 --duration 300     # the baseline

runs one fresh cluster per run, seeds ``--seed``, ``--seed``+1, ..., with progress bars (all
runs, and the current run's phase), and writes under ``--results`` (``faults-results/``)::

    faults-results/<target>-<UTC time>/
        summary.json                      one row per run, updated after each
        run-001-seed-<seed>/
            history.jsonl.gz              every event (stratalog.faults.history), gzipped
            result.json                   config, timings, nemesis, the checker's verdict
            clients.log                   librdkafka's log lines
            logs/                         the brokers' (and etcd's) logs
            cluster/                      data directories, kept only when a run is not valid

Other options: ``--faults kill1,kill2,pause1,coord-kill,coord-pause`` (the mix, the default;
also ``etcd-cut1`` and ``isolate1``, Stratalog only, with ``--cut 6,6`` seconds and
``--cut-mode blackhole|refuse``; ``--fixed`` runs it once in order), ``--rate 200`` sends/s,
``--partitions 8``, ``--gap 5,15`` fault-free seconds after each fault,
``--restart-delay 0,5``, ``--pause 5,5``, ``--settle 10``,
``--final-read-timeout 200``, ``--set KEY=VALUE`` (broker settings or Kafka properties),
``--flush-messages`` (Kafka: ``flush.messages=1``), ``--broker-log-level INFO`` (Stratalog),
``--stop-on-anomaly``. The history's first event holds the wall clock at its time 0, to line it
up with the brokers' logs. Then::

    python -m stratalog.faults summary faults-results/            # the table of every run
    python -m stratalog.faults check <run>/history.jsonl.gz --json  # check a history again
    python -m stratalog.faults run --target kafka --duration 60 --seed 7   # a single run

A run's verdict is ``valid``: ``True`` (no anomaly), ``False`` (a safety anomaly) or
``"unknown"`` (only unseen values or a partition that could not be read to its end).
The exit status of ``soak`` and ``run`` is 0 only when every run was valid.
"""
