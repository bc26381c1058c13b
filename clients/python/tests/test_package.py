"""The package as shipped: its Lua scripts are the project's lua/*.lua."""
import os

from conftest import ROOT

import redis_ratelimit

PKG_LUA = os.path.join(os.path.dirname(redis_ratelimit.__file__), "lua")
LUA = os.path.join(ROOT, "lua")


def test_packaged_scripts_equal_the_projects():
    # python3 lua/build.py writes them; this fails when it was not run.
    project = sorted(f for f in os.listdir(LUA) if f.endswith(".lua") and f != "library.lua")
    packaged = sorted(f for f in os.listdir(PKG_LUA) if f.endswith(".lua"))
    assert packaged == project
    for f in project:
        with open(os.path.join(LUA, f), "rb") as a, open(os.path.join(PKG_LUA, f), "rb") as b:
            assert a.read() == b.read(), f"{f} differs: run python3 lua/build.py"


def test_public_names():
    for name in redis_ratelimit.__all__:
        assert getattr(redis_ratelimit, name) is not None, name


def test_wheel_ships_the_scripts(tmp_path):
    """`pip install ./clients/python` gets the Lua twins inside the package."""
    import subprocess
    import sys
    import zipfile
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(tmp_path), here],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (whl,) = tmp_path.glob("redis_ratelimit-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for f in os.listdir(PKG_LUA):
        assert f"redis_ratelimit/lua/{f}" in names
    assert "redis_ratelimit/asgi.py" in names and "redis_ratelimit/aio.py" in names
