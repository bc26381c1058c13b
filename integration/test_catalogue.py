"""The parts no Rust compiler reaches, checked against the catalogue of limit
kinds (crates/ratelimit-core/src/catalogue.rs, exported as
crates/ratelimit-core/catalogue.json, which a unit test there keeps equal to
it): the Lua twins, the Python client and the Node client each know every
kind by the catalogue's names, commands, RL.MULTI words and arguments. A kind
added to the catalogue and missing in any of them fails here; so does a kind
one of them has that the catalogue does not. Then the module's INFO
counters and events are the catalogue's, CL.THROTTLE's included."""

import json
import os
import re
import subprocess
import typing

import pytest
import redis

from rltesting import proc
from redis_ratelimit import core, policies

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CATALOGUE = os.path.join(ROOT, "crates", "ratelimit-core", "catalogue.json")


def kinds():
    with open(CATALOGUE) as f:
        return json.load(f)["kinds"]


def names():
    return [k["name"] for k in kinds()]


def test_the_catalogue_lists_the_five_kinds():
    assert names() == ["tokenbucket", "slidinglog", "slidingcounter", "fixedwindow", "concurrency"]


def test_every_kind_has_its_lua_twin():
    """lua/<name>.lua answers the kind's command, and multi.lua knows its
    word, its command and its number of positional arguments."""
    with open(os.path.join(ROOT, "lua", "multi.lua")) as f:
        multi = f.read()
    tables = {m.group(1): int(m.group(2)) for m in
              re.finditer(r"command = '(RL\.[A-Z]+)', script = 'rl\.[a-z]+', nparams = (\d+)", multi)}
    for k in kinds():
        with open(os.path.join(ROOT, "lua", f"{k['name']}.lua")) as f:
            assert k["command"] in f.read(), k
        assert tables.get(k["command"]) == len(k["args"]), (k, tables)
        assert re.search(rf"\b{k['word']}\b", multi), k
    assert sorted(tables) == sorted(k["command"] for k in kinds())


def test_the_python_client_knows_every_kind():
    rate = names()
    assert set(typing.get_args(policies.Kind)) == set(rate)
    assert [s for s in core.SCRIPTS if s != "multi"] == rate
    made = {
        "tokenbucket": policies.token_bucket("a", 5, 1, 1000),
        "slidinglog": policies.sliding_log("a", 5, 1000),
        "slidingcounter": policies.sliding_counter("a", 5, 1000),
        "fixedwindow": policies.fixed_window("a", 5, 1000),
        "concurrency": policies.concurrency("a", 5, 1000),
    }
    assert sorted(made) == sorted(rate)
    for k in kinds():
        p = made[k["name"]]
        assert (p.kind, p.command) == (k["name"], k["command"])
        assert p.multi_spec()[0] == k["word"] and len(p.args()) == len(k["args"]), k


NODE_PROBE = """
import * as rl from './src/policy.js';
const made = [rl.tokenBucket('a', 5, 1, 1000), rl.slidingLog('a', 5, 1000),
              rl.slidingCounter('a', 5, 1000), rl.fixedWindow('a', 5, 1000),
              rl.concurrency('a', 5, 1000)];
console.log(JSON.stringify(made.map(p => ({command: p.command, word: p.multiName,
                                           script: p.script, nargs: p.params.length}))));
"""


def test_the_node_client_knows_every_kind():
    node = os.path.join(ROOT, "clients", "node")
    out = subprocess.run(["node", "--input-type=module", "-e", NODE_PROBE], cwd=node,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout)
    want = [{"command": k["command"], "word": k["word"], "script": k["name"], "nargs": len(k["args"])}
            for k in kinds()]
    assert got == want
    with open(os.path.join(node, "src", "backend.js")) as f:
        scripts = re.search(r"SCRIPT_NAMES = \[([^\]]*)\]", f.read()).group(1)
    rates = [k["name"] for k in kinds() if k["name"] != "concurrency"]
    assert re.findall(r"'([a-z]+)'", scripts) == rates + ["multi", "concurrency"]


def test_module_info_counters_and_events_are_the_catalogue_s(server_factory):
    """INFO ratelimit has a row per kind, RL.MULTI's and CL.THROTTLE's;
    CL.THROTTLE counts granted and denied calls (it has no PARTIAL or
    REFUND) and its writes emit cl.throttle."""
    r = server_factory(args=["--loadmodule", proc.MODULE, "CL.THROTTLE"], module=False).client()
    r.config_set("notify-keyspace-events", "KEd")
    info = r.info("ratelimit")
    for n in names() + ["multi"]:
        for col in ("granted", "partial", "denied", "refunds"):
            assert f"ratelimit_{n}_{col}" in info, (n, col, info)
    assert (info["ratelimit_throttle_granted"], info["ratelimit_throttle_denied"]) == (0, 0), info
    assert "ratelimit_throttle_partial" not in info and "ratelimit_throttle_refunds" not in info
    p = r.pubsub()
    p.psubscribe("__keyevent@0__:*")
    p.get_message(timeout=5)
    hour = 3600
    assert r.execute_command("CL.THROTTLE", "t", 1, 1, hour)[0] == 0       # granted
    assert r.execute_command("CL.THROTTLE", "t", 1, 1, hour)[0] == 0       # granted
    assert r.execute_command("CL.THROTTLE", "t", 1, 1, hour)[0] == 1       # denied
    assert r.execute_command("CL.THROTTLE", "t", 1, 1, hour, 0)[0] == 0    # quantity 0: granted
    with pytest.raises(redis.ResponseError):
        r.execute_command("CL.THROTTLE", "t", -1, 1, hour)                  # an error counts nothing
    info = r.info("ratelimit")
    assert (info["ratelimit_throttle_granted"], info["ratelimit_throttle_denied"]) == (3, 1), info
    events = []
    while (m := p.get_message(timeout=2)) is not None:
        if m["type"] == "pmessage":
            events.append(m["channel"])
    # Every allowed call writes (quantity 0 too, as redis-cell's does); a
    # denied one does not.
    assert events == [b"__keyevent@0__:cl.throttle"] * 3, events
    p.close()
