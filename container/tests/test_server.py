"""The server in each image: the module version MODULE LIST shows, and the
limiters' state across a stop and start of a container that keeps its AOF
(appendonly yes) on a volume."""
import time
import uuid

import docker
import pytest
import redis
from conftest import MODULE_PATH, TAGS, VERSION, start, url_of


def pairs(reply):
    return {(k.decode() if isinstance(k, bytes) else k): v for k, v in zip(reply[::2], reply[1::2])}


def test_module_list_shows_the_crate_version(module_server):
    c = module_server
    c.response_callbacks.pop("MODULE LIST", None)
    mods = [pairs(m) for m in c.execute_command("MODULE", "LIST")]
    (mod,) = [m for m in mods if m["name"] == b"ratelimit"]
    major, minor, patch = (int(x) for x in VERSION.split("."))
    assert mod["ver"] == major * 10000 + minor * 100 + patch, mod
    assert mod["path"] == MODULE_PATH.encode()


def workload(c):
    """Keys of every limiter: token buckets, sliding logs and counters,
    RL.MULTI, partial grants, refunds."""
    for i in range(8):
        tag = f"{{t{i}}}"
        c.execute_command("RL.TOKENBUCKET", f"rl:{tag}:tb", 20, 5, 60_000, "COST", 1 + i)
        c.execute_command("RL.SLIDINGLOG", f"rl:{tag}:log", 30, 600_000, "COST", 1 + i % 3)
        c.execute_command("RL.SLIDINGCOUNTER", f"rl:{tag}:ctr", 50, 600_000, "COST", 2 + i)
        c.execute_command("RL.MULTI", 2, f"rl:{tag}:m1", f"rl:{tag}:m2",
                          "TOKENBUCKET", 10, 1, 60_000, "SLIDINGCOUNTER", 5, 300_000, "COST", 2)
    c.execute_command("RL.TOKENBUCKET", "rl:{p}:tb", 10, 1, 60_000, "COST", 25, "PARTIAL")
    c.execute_command("RL.SLIDINGLOG", "rl:{t1}:log", 30, 600_000, "REFUND", 1)


def snapshot(c):
    keys = sorted(c.scan_iter(count=1000))
    return {k: (c.type(k), c.execute_command("DEBUG", "DIGEST-VALUE", k),
                c.execute_command("PEXPIRETIME", k)) for k in keys}


@pytest.mark.parametrize("name", ["redis", "valkey"])
def test_state_survives_a_restart_from_the_volume(name):
    volume = f"rl-persist-{uuid.uuid4().hex[:12]}"
    # The image's own arguments (its --loadmodule) and ours after them, as
    # docs/containers.md says to add arguments.
    cmd = docker.from_env().images.get(TAGS[name]).attrs["Config"]["Cmd"]
    cmd = cmd + ["--appendonly", "yes", "--enable-debug-command", "yes"]
    box = start(TAGS[name], cmd, volume=volume)
    try:
        c = redis.Redis.from_url(url_of(box))
        workload(c)
        before = snapshot(c)
        assert len(before) == 8 * 5 + 1
        assert {t for t, _, _ in before.values()} == {b"rl-tokbkt", b"rl-slilog", b"rl-slicnt"}
        assert all(exp > 0 for _, _, exp in before.values())
        c.close()
        box.get_wrapped_container().stop(timeout=10)
        box.get_wrapped_container().start()
        c = redis.Redis.from_url(url_of(box), retry_on_timeout=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                if c.info("persistence")["loading"] == 0:
                    break
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            box.get_wrapped_container().reload()
            assert box.get_wrapped_container().status == "running", box.get_logs()
            assert time.monotonic() < deadline, "the restarted server did not answer in 60 s"
            time.sleep(0.05)
        logs = b"".join(box.get_logs()).decode()
        assert "DB loaded from append only file" in logs, logs
        assert c.info("persistence")["aof_enabled"] == 1
        assert snapshot(c) == before
        c.close()
    finally:
        box.stop()
        box.get_docker_client().client.volumes.get(volume).remove(force=True)
