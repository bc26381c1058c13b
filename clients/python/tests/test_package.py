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
    """`pip install ./clients/python` gets the Lua twins inside the package.

    The wheel is built from a copy of clients/python and lua/ (the layout
    setup.py expects), without the generated scripts: the build must make
    them. Building in the checkout itself would share its build/ and
    *.egg-info with a second run of this suite (make test-clients-py runs two
    at once), and setuptools then fails on files the other build removed."""
    import shutil
    import subprocess
    import sys
    import zipfile
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    src = tmp_path / "src"
    shutil.copytree(here, src / "clients" / "python", ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__", "tests", "lua"))
    shutil.copytree(LUA, src / "lua", ignore=shutil.ignore_patterns("__pycache__"))
    assert not (src / "clients" / "python" / "redis_ratelimit" / "lua").exists()
    out = tmp_path / "wheel"
    p = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--no-build-isolation", "-w", str(out), str(src / "clients" / "python")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    (whl,) = out.glob("redis_ratelimit-*.whl")
    names = set(zipfile.ZipFile(whl).namelist())
    for f in os.listdir(PKG_LUA):
        assert f"redis_ratelimit/lua/{f}" in names
    assert "redis_ratelimit/asgi.py" in names and "redis_ratelimit/aio.py" in names


def test_decisions_are_frozen_slotted_and_survive_pickle_and_copy():
    import copy
    import dataclasses
    import pickle

    from redis_ratelimit import Decision, Part, all_of, sliding_log, token_bucket
    pol = all_of(token_bucket("a", 5, 1, 1000), sliding_log("b", 3, 1000))
    parts = (Part("a", 1, 5, 4, 0, 200), Part("b", 1, 3, 2, 0, 1000))
    d = Decision(allowed=True, granted=1, limit=3, remaining=2, retry_after_ms=0,
                 reset_after_ms=1000, policy=pol.name, binding="b", source="module",
                 parts=parts, rule=pol)
    for attr, value in (("allowed", False), ("granted", 0), ("rule", None)):
        try:
            setattr(d, attr, value)
        except dataclasses.FrozenInstanceError:
            continue
        raise AssertionError(f"Decision.{attr} could be set")
    assert not hasattr(d, "__dict__") and not hasattr(parts[0], "__dict__")
    # equal: everything but the policy object itself
    same_rule = all_of(token_bucket("a", 5, 1, 1000), sliding_log("b", 3, 1000))
    assert d == dataclasses.replace(d, rule=same_rule)
    assert d != dataclasses.replace(d, source="lua") and d != dataclasses.replace(d, granted=0)
    for twin in (copy.copy(d), copy.deepcopy(d), pickle.loads(pickle.dumps(d))):
        assert twin == d and twin.parts == parts and repr(twin) == repr(d)
    # the package's own decisions (built without Decision.__init__) are the same objects
    from redis_ratelimit.core import to_decision
    made = to_decision([1, 3, 2, 0, 1000, 1, [[1, 5, 4, 0, 200], [1, 3, 2, 0, 1000]]], pol, 1,
                       False, "module")
    assert type(made) is Decision and made == d and repr(made) == repr(d)
    assert not hasattr(made, "__dict__") and pickle.loads(pickle.dumps(made)) == d
    try:
        made.granted = 0
        raise AssertionError("a decision the package made could be changed")
    except dataclasses.FrozenInstanceError:
        pass
    assert repr(parts[0]) == ("Part('a', granted=1, limit=5, remaining=4, retry_after_ms=0, "
                              "reset_after_ms=200)")
