#!/usr/bin/env bash
# The unpinned install test (issue 20): the client packages installed as a
# new user installs them, with whatever the registries serve today, then the
# SIGSTOP bound test, the exactness test and the header test against a real
# server with the module (make test-clients-fresh).
#
#   Python: a fresh virtualenv, `pip install ./clients/python[valkey,glide,glide-sync]`
#           (no pins: redis-py, and Valkey's clients valkey-py, valkey-glide and
#           valkey-glide-sync; and pytest to run the tests), the tests run on the
#           installed package, the SIGSTOP bound on every client kind.
#   Node:   an empty npm project without a lock file, `npm install
#           ./clients/node ioredis redis iovalkey @valkey/valkey-glide`; the
#           tests run from that project, on its drivers, against the
#           installed package (the bound test on Valkey's clients too).
#
# RL_FRESH_PY_PKG / RL_FRESH_NODE_PKG install another tree instead (to show
# the test fails on the package before the fix); RL_FRESH=py|node runs one.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MODULE=${RL_MODULE:-$ROOT/target/release/libredis_ratelimit.so}
PY_PKG=${RL_FRESH_PY_PKG:-$ROOT/clients/python}
NODE_PKG=${RL_FRESH_NODE_PKG:-$ROOT/clients/node}
WHICH=${RL_FRESH:-py node}
work=$(mktemp -d /tmp/rl-fresh.XXXXXX)
trap 'rm -rf "$work"' EXIT
rc=0

if [[ " $WHICH " == *" py "* ]]; then
  echo "== fresh install, Python: pip install $PY_PKG[valkey,glide,glide-sync] (no pins)"
  python3 -m venv "$work/venv"
  # and the test-support package the tests import (rltesting, testing/)
  "$work/venv/bin/pip" install -q --disable-pip-version-check "$PY_PKG[valkey,glide,glide-sync]" pytest
  "$work/venv/bin/pip" install -q --disable-pip-version-check --no-deps -e "$ROOT/testing"
  "$work/venv/bin/python" - <<'PY'
import redis, redis_ratelimit, sys, valkey
from importlib.metadata import version
assert "site-packages" in redis_ratelimit.__file__, redis_ratelimit.__file__
print(f"installed: redis-ratelimit from {redis_ratelimit.__file__}, redis-py {redis.__version__}, "
      f"valkey-py {valkey.__version__}, valkey-glide {version('valkey-glide')}, "
      f"valkey-glide-sync {version('valkey-glide-sync')}")
PY
  # from $work, so that the cwd does not put the source tree's package
  # before the installed one
  (cd "$work" && RL_MODULE=$MODULE "$work/venv/bin/python" -m pytest -q -rfE \
     -p no:cacheprovider --rootdir "$ROOT/clients/python" \
     "$ROOT/clients/python/tests/test_bound.py" "$ROOT/clients/python/tests/test_exactness.py" \
     "$ROOT/clients/python/tests/test_headers.py") || rc=1
  # the SIGSTOP bound on each Valkey client kind (tests/valkey_drivers.py)
  (cd "$work" && RL_MODULE=$MODULE "$work/venv/bin/python" -m pytest -q -rfE \
     -p no:cacheprovider --rootdir "$ROOT/clients/python" -k "sigstop or refused" \
     "$ROOT/clients/python/tests/test_valkey_clients.py") || rc=1
fi

if [[ " $WHICH " == *" node "* ]]; then
  echo "== fresh install, Node: npm install $NODE_PKG ioredis redis iovalkey @valkey/valkey-glide (no lock file)"
  proj=$work/node
  mkdir -p "$proj" && cd "$proj"
  npm init -y >/dev/null && npm pkg set type=module   # the tests are ES modules
  # GLIDE's native core comes from an optional platform package
  # (@valkey/valkey-glide-linux-x64-gnu here)
  npm install --no-audit --no-fund --loglevel=error "$NODE_PKG" ioredis redis iovalkey @valkey/valkey-glide
  for p in ioredis redis iovalkey @valkey/valkey-glide; do echo "installed: $p $(node -p "require('./node_modules/$p/package.json').version" --input-type=commonjs)"; done
  # the package's tests, run from this project on its drivers and on the
  # installed package (their ../src/ and ../lua/ point into node_modules)
  cp -r "$NODE_PKG/test" "$proj/test"
  pkg=$proj/node_modules/redis-ratelimit
  sed -i -e "s#'\.\./\.\./src/#'$pkg/src/#g" -e "s#'\.\./src/#'$pkg/src/#g" \
      -e "s#new URL('\.\./\.\./\.\./lua/', import.meta.url)#new URL('file://$ROOT/lua/')#" \
      -e "s#new URL('\.\./lua/', import.meta.url)#new URL('file://$pkg/lua/')#" \
      -e "s#new URL(\`\.\./lua/#new URL(\`file://$pkg/lua/#" \
      "$proj"/test/*.js "$proj"/test/fixtures/*.js
  RL_NODE_DRIVERS=ioredis-npm,node-redis-npm RL_ROOT=$ROOT RL_MODULE=$MODULE \
    node --test --test-concurrency=1 test/bound.test.js test/leased.test.js test/unit.test.js || rc=1
  RL_NODE_DRIVERS=iovalkey-npm,glide-npm RL_ROOT=$ROOT RL_MODULE=$MODULE \
    node --test --test-concurrency=1 test/bound.test.js || rc=1
fi
exit $rc
