#!/usr/bin/env python3
"""Copy the project's Lua twins (lua/*.lua, but not the Functions library)
into the package, which ships them for servers without the module.
tests/test_package.py fails when the copies are out of date."""
import os
import shutil

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "lua")
DST = os.path.join(HERE, "redis_ratelimit", "lua")

os.makedirs(DST, exist_ok=True)
wanted = {f for f in os.listdir(SRC) if f.endswith(".lua") and f != "library.lua"}
for f in os.listdir(DST):
    if f.endswith(".lua") and f not in wanted:
        os.remove(os.path.join(DST, f))
for f in sorted(wanted):
    shutil.copyfile(os.path.join(SRC, f), os.path.join(DST, f))
print(f"copied {len(wanted)} scripts into {DST}")
