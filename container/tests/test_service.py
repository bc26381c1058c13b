"""The Envoy rate-limit service's image (redis-ratelimit-service:<version>,
make image) against the Redis image with the module: ShouldRateLimit over
gRPC from a real gRPC client (grpcio), POST /json, /healthcheck and
Prometheus /metrics, with the image started as envoyproxy/ratelimit's compose
files start theirs (`command: /bin/ratelimit`, config under
/data/ratelimit/config).

The gRPC messages are encoded and decoded here by hand from the field
numbers of Envoy's protos (envoy.service.ratelimit.v3 and
envoy.extensions.common.ratelimit.v3): an independent reading of the wire
format, with no generated code."""
import json
import os
import tempfile
import time
import urllib.error
import urllib.request

import grpc
import pytest
from conftest import TAGS, VERSION
from testcontainers.core.container import DockerContainer
from testcontainers.core.wait_strategies import LogMessageWaitStrategy

SERVICE_TAG = f"redis-ratelimit-service:{VERSION}"
METHOD = "/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"
OK, OVER_LIMIT = 1, 2

CONFIG = """\
domain: edge
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 3}
  - key: site
    rate_limit: {unit: hour, requests_per_unit: 100}
"""


def varint(n):
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def field(num, payload):
    """A length-delimited field (wire type 2)."""
    return varint(num << 3 | 2) + varint(len(payload)) + payload


def encode_request(domain, descriptors, hits_addend=0):
    """RateLimitRequest{domain=1, descriptors=2 {entries=1 {key=1, value=2}}, hits_addend=3}."""
    out = field(1, domain.encode())
    for entries in descriptors:
        d = b"".join(field(1, field(1, k.encode()) + field(2, v.encode())) for k, v in entries)
        out += field(2, d)
    if hits_addend:
        out += varint(3 << 3) + varint(hits_addend)
    return out


def parse(buf):
    """The fields of a message: {number: [value, ...]} (varints as ints, length-delimited as bytes)."""
    fields, i = {}, 0
    while i < len(buf):
        key, i = read_varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = read_varint(buf, i)
        elif wire == 2:
            n, i = read_varint(buf, i)
            v, i = buf[i:i + n], i + n
        else:
            raise AssertionError(f"unexpected wire type {wire}")
        fields.setdefault(num, []).append(v)
    return fields


def read_varint(buf, i):
    n = shift = 0
    while True:
        b = buf[i]
        i += 1
        n |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return n, i


def decode_response(buf):
    """(overall_code, [(code, requests_per_unit, unit, limit_remaining, reset seconds)])."""
    f = parse(buf)
    statuses = []
    for s in f.get(2, []):
        s = parse(s)
        lim = parse(s[2][0]) if 2 in s else {}
        reset = parse(s[4][0]).get(1, [0])[0] if 4 in s else 0
        statuses.append((s.get(1, [0])[0], lim.get(1, [0])[0], lim.get(2, [0])[0], s.get(3, [0])[0], reset))
    return f.get(1, [0])[0], statuses


@pytest.fixture(scope="module")
def service():
    """The Redis image with the module and the service image sharing its
    network namespace (the service reaches Redis on 127.0.0.1:6379; the
    ports are published by the Redis container). Yields the host addresses."""
    conf = tempfile.mkdtemp(prefix="rl-svc-conf-")
    os.makedirs(f"{conf}/config")
    with open(f"{conf}/config/config.yaml", "w") as fh:
        fh.write(CONFIG)
    for p in (conf, f"{conf}/config", f"{conf}/config/config.yaml"):
        os.chmod(p, 0o755)  # the service runs as nobody
    t0 = time.monotonic()
    # each container object is stopped (removed) even when its start fails:
    # testcontainers creates the container before starting it
    redis_c = (DockerContainer(TAGS["redis"]).with_exposed_ports(6379, 8080, 8081, 9090)
               .waiting_for(LogMessageWaitStrategy("Ready to accept connections")))
    svc = None
    try:
        redis_c.start()
        # one CPU, as a pod with a one-CPU cpuset: the image's binary runs
        # tokio's single-threaded runtime (test_one_cpu_runs_single_threaded)
        svc = (DockerContainer(SERVICE_TAG, network_mode=f"container:{redis_c.get_wrapped_container().id}",
                               cpuset_cpus="0")
               .with_command("/bin/ratelimit")
               .with_env("REDIS_SOCKET_TYPE", "tcp").with_env("REDIS_URL", "127.0.0.1:6379")
               .with_env("REDIS_TIMEOUT", "1s").with_env("USE_STATSD", "false")
               .with_env("USE_PROMETHEUS", "true")
               .with_env("RUNTIME_ROOT", "/data").with_env("RUNTIME_SUBDIRECTORY", "ratelimit")
               .with_env("RUNTIME_WATCH_ROOT", "false")
               # the runtime's line is at info (LOG_LEVEL is WARN unless set)
               .with_env("LOG_LEVEL", "info")
               .with_volume_mapping(conf, "/data/ratelimit", "ro")
               .waiting_for(LogMessageWaitStrategy("listening:")))
        svc.start()
        host = redis_c.get_container_host_ip()
        addrs = {p: f"{host}:{redis_c.get_exposed_port(p)}" for p in (8080, 8081, 9090)}
        print(f"containers started in {time.monotonic() - t0:.1f} s")
        addrs["logs"] = lambda: b"".join(svc.get_logs()).decode(errors="replace")
        yield addrs
    finally:
        if svc is not None:
            svc.stop()  # first: it uses the Redis container's network namespace
        redis_c.stop()
        for p in ("config/config.yaml", "config", ""):
            path = os.path.join(conf, p)
            (os.remove if p.endswith(".yaml") else os.rmdir)(path)


def http(url, body=None):
    req = urllib.request.Request(url, data=body and json.dumps(body).encode(), method="POST" if body else "GET")
    try:
        with urllib.request.urlopen(req, timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def test_one_cpu_runs_single_threaded(service):
    """The service container has one CPU (cpuset 0): the binary says it runs
    tokio's single-threaded runtime, and answers (the other tests)."""
    assert "runtime: single-threaded (1 CPU)" in service["logs"](), service["logs"]()


def test_the_image_answers_should_rate_limit_over_grpc(service):
    with grpc.insecure_channel(service[8081]) as ch:
        call = ch.unary_unary(METHOD, request_serializer=lambda b: b, response_deserializer=lambda b: b)
        ask = lambda *ds, hits=0: decode_response(call(encode_request("edge", list(ds), hits), timeout=10))  # noqa: E731
        user = [("user", "alice")]
        # 3 an hour: 2, 1, 0 left, then OVER_LIMIT (HOUR is unit 3)
        got = [ask(user) for _ in range(4)]
        assert [(o, s[0][0], s[0][3]) for o, s in got] == [(OK, OK, 2), (OK, OK, 1), (OK, OK, 0),
                                                          (OVER_LIMIT, OVER_LIMIT, 0)]
        assert {s[0][1:3] for _, s in got} == {(3, 3)}
        assert all(1 <= s[0][4] <= 3600 for _, s in got)
        # atomic: site with the spent user is denied and site keeps its 100
        overall, st = ask([("site", "")], user)
        assert (overall, st[0][:4], st[1][0]) == (OVER_LIMIT, (OK, 100, 3, 100), OVER_LIMIT)
        overall, st = ask([("site", "")], hits=5)
        assert (overall, st[0][3]) == (OK, 95)
        # no such domain: OK, no limit
        assert decode_response(call(encode_request("nope", [user]), timeout=10)) == (OK, [(OK, 0, 0, 0, 0)])
        # an empty domain: INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as e:
            call(encode_request("", [user]), timeout=10)
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT

    # POST /json shares the counters; /healthcheck; /metrics counted every call
    st, body = http(f"http://{service[8080]}/json",
                    {"domain": "edge", "descriptors": [{"entries": [{"key": "site"}]}]})
    assert st == 200 and json.loads(body)["statuses"][0]["limitRemaining"] == 94, body
    st, body = http(f"http://{service[8080]}/json",
                    {"domain": "edge", "descriptors": [{"entries": [{"key": "user", "value": "alice"}]}]})
    assert st == 429 and json.loads(body)["overallCode"] == "OVER_LIMIT", body
    assert http(f"http://{service[8080]}/healthcheck") == (200, "OK")
    st, metrics = http(f"http://{service[9090]}/metrics")
    assert st == 200
    samples = dict(line.rsplit(" ", 1) for line in metrics.splitlines() if line and not line.startswith("#"))
    assert samples['ratelimit_service_rate_limit_total_hits{domain="edge",key1="user"}'] == "6"
    assert samples['ratelimit_service_rate_limit_over_limit{domain="edge",key1="user"}'] == "3"
    assert samples['ratelimit_service_total_requests{grpc_method="ShouldRateLimit"}'] == "10"
