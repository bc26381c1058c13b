"""The package's one build step: the Lua scripts it ships
(redis_ratelimit/lua/*.lua) are generated from the repository's lua/src by
lua/build.py when the package is built (a wheel, an sdist, or
`pip install ./clients/python`); they are not committed. The rest of the
metadata is in pyproject.toml.
"""
import os
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))
LUA_BUILD = os.path.join(HERE, "..", "..", "lua", "build.py")
PKG_LUA = os.path.join(HERE, "redis_ratelimit", "lua")


def generate_scripts():
    if os.path.exists(LUA_BUILD):
        subprocess.run([sys.executable, LUA_BUILD, "--out", PKG_LUA], check=True, stdout=subprocess.DEVNULL)
    # Outside the repository (building from an sdist) they must have come along.
    if not (os.path.isdir(PKG_LUA) and any(f.endswith(".lua") for f in os.listdir(PKG_LUA))):
        raise SystemExit("redis_ratelimit/lua/*.lua missing: build from the repository (lua/build.py makes them)")


class BuildPyWithScripts(build_py):
    def run(self):
        generate_scripts()
        super().run()


class SdistWithScripts(sdist):
    def run(self):
        generate_scripts()
        super().run()


setup(cmdclass={"build_py": BuildPyWithScripts, "sdist": SdistWithScripts})
