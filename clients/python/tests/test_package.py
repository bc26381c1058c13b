"""The package as shipped: its Lua scripts are the project's lua/*.lua."""
import os

from conftest import ROOT

import redis_ratelimit

PKG_LUA = os.path.join(os.path.dirname(redis_ratelimit.__file__), "lua")
LUA = os.path.join(ROOT, "lua")


def test_packaged_scripts_equal_the_projects():
    # clients/python/sync_lua.py copies them; this fails when it was not run.
    project = sorted(f for f in os.listdir(LUA) if f.endswith(".lua") and f != "library.lua")
    packaged = sorted(f for f in os.listdir(PKG_LUA) if f.endswith(".lua"))
    assert packaged == project
    for f in project:
        with open(os.path.join(LUA, f), "rb") as a, open(os.path.join(PKG_LUA, f), "rb") as b:
            assert a.read() == b.read(), f"{f} differs: run python3 clients/python/sync_lua.py"


def test_public_names():
    for name in redis_ratelimit.__all__:
        assert getattr(redis_ratelimit, name) is not None, name
