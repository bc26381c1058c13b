"""What an adopter relies on beyond the commands themselves: COMMAND DOCS and
key specs, ACL categories, the module version, honest MEMORY USAGE, and the
release tarball (`make dist`) loading into the server under test.

Every test runs on whatever server REDIS_SERVER names (the matrix runs the
suite on Redis 7.0, Valkey 8.1 and Valkey 9.1). A check that cannot apply to
a server is skipped with the reason printed.
"""
import os
import re

import pytest
import redis

from harness import ROOT

LIMITERS = ("RL.TOKENBUCKET", "RL.SLIDINGLOG", "RL.SLIDINGCOUNTER")

# Arguments as COMMAND DOCS must list them: (name, type, token, optional).
OPTIONS = [("cost", "integer", "COST", True), ("partial", "pure-token", "PARTIAL", True),
           ("dryrun", "pure-token", "DRYRUN", True)]
EXPECTED_ARGS = {
    "RL.TOKENBUCKET": [("key", "key", None, False), ("capacity", "integer", None, False),
                       ("rate", "integer", None, False), ("period_ms", "integer", None, False), *OPTIONS],
    "RL.SLIDINGLOG": [("key", "key", None, False), ("limit", "integer", None, False),
                      ("window_ms", "integer", None, False), *OPTIONS],
    "RL.SLIDINGCOUNTER": [("key", "key", None, False), ("limit", "integer", None, False),
                          ("window_ms", "integer", None, False), *OPTIONS],
    "RL.STATE": [("key", "key", None, False), ("payload", "string", None, False)],
}
# A valid call of each command (for COMMAND GETKEYS and the ACL test).
CALLS = {
    "RL.TOKENBUCKET": ["{k}", "10", "1", "1000", "COST", "2", "PARTIAL"],
    "RL.SLIDINGLOG": ["{k}", "10", "1000", "DRYRUN"],
    "RL.SLIDINGCOUNTER": ["{k}", "10", "1000"],
    "RL.STATE": ["{k}", "payload"],
}
KEY_FLAGS = {
    "RL.TOKENBUCKET": {"RW", "access", "update"},
    "RL.SLIDINGLOG": {"RW", "access", "update"},
    "RL.SLIDINGCOUNTER": {"RW", "access", "update"},
    "RL.STATE": {"OW", "update"},
}


def s(v):
    return v.decode() if isinstance(v, bytes) else v


def pairs(flat):
    """A RESP2 flat [k1, v1, k2, v2, ...] list as a dict with str keys."""
    return {s(flat[i]): flat[i + 1] for i in range(0, len(flat), 2)}


def server_kind(c):
    """('valkey' | 'redis', (major, minor))."""
    info = c.info("server")
    if "valkey_version" in info:
        v = str(info["valkey_version"])
        kind = "valkey"
    else:
        v = str(info["redis_version"])
        kind = "redis"
    major, minor = (int(x) for x in v.split(".")[:2])
    return kind, (major, minor)


def offers_acl_category_api(c):
    """Whether this server's module API has AddACLCategory (Redis 7.4+,
    Valkey 8+). The module itself probes the function pointer; the test
    knows the releases so that a module that failed to use it fails here."""
    kind, ver = server_kind(c)
    return ver >= (8, 0) if kind == "valkey" else ver >= (7, 4)


def crate_version():
    with open(os.path.join(ROOT, "Cargo.toml")) as f:
        text = f.read()
    m = re.search(r'^\[package\][^\[]*?^version\s*=\s*"(\d+)\.(\d+)\.(\d+)"', text, re.M | re.S)
    assert m, "no [package] version in Cargo.toml"
    return tuple(int(x) for x in m.groups())


def module_info(c):
    return c.info("ratelimit")


@pytest.fixture
def r(server):
    """A client that returns COMMAND and MODULE LIST replies as the server
    sends them (redis-py reshapes those into dicts)."""
    c = server.client()
    for name in ("COMMAND", "COMMAND GETKEYS", "MODULE LIST", "ACL CAT"):
        c.response_callbacks.pop(name, None)
    yield c
    c.close()


# ---------------------------------------------------------------------------
# COMMAND DOCS, COMMAND GETKEYS, key specs
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("cmd", sorted(EXPECTED_ARGS))
def test_command_docs(r, cmd):
    reply = r.execute_command("COMMAND", "DOCS", cmd)
    assert len(reply) == 2 and s(reply[0]).upper() == cmd, reply
    doc = pairs(reply[1])
    assert s(doc["group"]) == "module" and s(doc["module"]) == "ratelimit", doc
    assert len(s(doc["summary"])) > 20, doc
    assert re.fullmatch(r"\d+\.\d+\.\d+", s(doc["since"])), doc
    assert s(doc["complexity"]).startswith("O("), doc
    got = []
    for a in doc["arguments"]:
        a = pairs(a)
        flags = {s(f) for f in a.get("flags", [])}
        got.append((s(a["name"]), s(a["type"]), s(a["token"]) if "token" in a else None, "optional" in flags))
        if s(a["type"]) == "key":
            assert a["key_spec_index"] == 0, a
    assert got == EXPECTED_ARGS[cmd]


@pytest.mark.parametrize("cmd", sorted(CALLS))
def test_command_getkeys_and_key_specs(r, cmd):
    args = [a.format(k="rl:{tenant}:user") for a in CALLS[cmd]]
    assert [s(k) for k in r.execute_command("COMMAND", "GETKEYS", cmd, *args)] == ["rl:{tenant}:user"]
    info = r.execute_command("COMMAND", "INFO", cmd)[0]
    # name, arity, flags, first, last, step, acl categories, tips, key specs, subcommands
    assert [info[3], info[4], info[5]] == [1, 1, 1], info
    specs = info[8]
    assert len(specs) == 1, specs
    spec = pairs(specs[0])
    assert {s(f) for f in spec["flags"]} == KEY_FLAGS[cmd], spec
    bs, fk = pairs(spec["begin_search"]), pairs(spec["find_keys"])
    assert s(bs["type"]) == "index" and pairs(bs["spec"])["index"] == 1, spec
    assert s(fk["type"]) == "range" and pairs(fk["spec"]) == {"lastkey": 0, "keystep": 1, "limit": 0}, spec


def test_module_version_from_crate(r):
    major, minor, patch = crate_version()
    mods = [pairs(m) for m in r.execute_command("MODULE", "LIST")]
    (mod,) = [m for m in mods if s(m["name"]) == "ratelimit"]
    assert mod["ver"] == major * 10000 + minor * 100 + patch, mod
    info = module_info(r)
    assert str(info["ratelimit_version"]) == f"{major}.{minor}.{patch}", info
    assert info["ratelimit_version_num"] == mod["ver"], info
    assert info["ratelimit_command_docs"] == 1, info


# ---------------------------------------------------------------------------
# ACL
# ---------------------------------------------------------------------------

def test_acl_category_ratelimit(server, r):
    info = module_info(r)
    kind, ver = server_kind(r)
    if not offers_acl_category_api(r):
        # Loaded cleanly without it, and says so.
        assert info["ratelimit_acl_category_ratelimit"] == 0, info
        with pytest.raises(redis.ResponseError, match="(?i)unknown category"):
            r.execute_command("ACL", "CAT", "ratelimit")
        pytest.skip(f"{kind} {ver[0]}.{ver[1]} has no RedisModule_AddACLCategory: "
                    "no ratelimit category (INFO says ratelimit_acl_category_ratelimit:0)")
    assert info["ratelimit_acl_category_ratelimit"] == 1, info
    assert info["ratelimit_acl_categories"] == 1, info
    members = {s(c).upper() for c in r.execute_command("ACL", "CAT", "ratelimit")}
    assert members == set(LIMITERS), members
    # The standard categories that fit.
    for cmd in LIMITERS:
        cats = {s(c) for c in r.execute_command("COMMAND", "INFO", cmd)[0][6]}
        assert cats == {"@ratelimit", "@write", "@fast"}, (cmd, cats)
    cats = {s(c) for c in r.execute_command("COMMAND", "INFO", "RL.STATE")[0][6]}
    assert cats == {"@write", "@slow", "@dangerous"}, cats

    r.execute_command("ACL", "SETUSER", "gateway", "on", ">pw", "~rl:*", "+@ratelimit")
    g = server.client(username="gateway", password="pw")
    try:
        for cmd in LIMITERS:
            reply = g.execute_command(cmd, *[a.format(k=f"rl:{cmd}") for a in CALLS[cmd]])
            assert len(reply) == 5, reply
        # A payload RL.STATE would refuse anyway: the ACL refuses it first.
        with pytest.raises(redis.exceptions.NoPermissionError):
            g.execute_command("RL.STATE", "rl:x", "payload")
        with pytest.raises(redis.exceptions.NoPermissionError):
            g.execute_command("SET", "rl:x", "1")
        # Key patterns apply through the key specs.
        with pytest.raises(redis.exceptions.NoPermissionError):
            g.execute_command("RL.TOKENBUCKET", "other:x", 10, 1, 1000)
    finally:
        g.close()
    print(f"{kind} {ver[0]}.{ver[1]}: +@ratelimit grants {sorted(members)}, refuses RL.STATE and SET")


def test_acl_standard_categories_where_offered(r):
    """Redis 7.2+ and Valkey 8+ have SetCommandACLCategories; Redis 7.0 has
    neither it nor AddACLCategory, and module commands there belong to no
    category (a user needs +RL.TOKENBUCKET etc. by name)."""
    kind, ver = server_kind(r)
    info = module_info(r)
    has_api = ver >= (8, 0) if kind == "valkey" else ver >= (7, 2)
    if not has_api:
        assert info["ratelimit_acl_categories"] == 0, info
        cats = r.execute_command("COMMAND", "INFO", "RL.TOKENBUCKET")[0][6]
        assert cats == [], cats
        pytest.skip(f"{kind} {ver[0]}.{ver[1]} has no RedisModule_SetCommandACLCategories: "
                    "module commands carry no ACL category (INFO says ratelimit_acl_categories:0)")
    assert info["ratelimit_acl_categories"] == 1, info
    writers = {s(c).upper() for c in r.execute_command("ACL", "CAT", "write")}
    assert set(LIMITERS) | {"RL.STATE"} <= writers
