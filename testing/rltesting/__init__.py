"""redis-ratelimit's test support, by concern:

    rltesting.proc         server processes (Server), MODULE, REDIS_SERVER, SERVER, wait_until, run_cli
    rltesting.servers      the server builds of the matrix, by name (python -m rltesting.servers)
    rltesting.replies      command arguments, options, reply invariants, INFO, keyspace digests
    rltesting.replication  replicas, WAIT, AOF rewrite / BGSAVE waits, a replication-stream tap
    rltesting.cluster      Redis Cluster of module-loaded nodes, hash tags by slot
    rltesting.workload     a workload thread whose first error fails the test
    rltesting.fixtures     the pytest fixtures server_factory and server
    rltesting.matrix       the suite x run matrix of junit reports (python -m rltesting.matrix)

Installed editable into the test virtualenv by `make venv`.
"""
