"""Decisions, and what HTTP makes of them: headers and the 429 body."""

__all__ = ["Decision", "Part", "headers", "problem"]

QUOTA_EXCEEDED = "https://iana.org/assignments/http-problem-types#quota-exceeded"
QUOTA_TITLE = "Request cannot be satisfied as assigned quota has been exceeded"


class Part:
    """One policy's answer inside an all_of decision."""

    __slots__ = ("policy", "granted", "limit", "remaining", "retry_after_ms", "reset_after_ms")

    def __init__(self, policy, granted, limit, remaining, retry_after_ms, reset_after_ms):
        self.policy = policy
        self.granted = granted
        self.limit = limit
        self.remaining = remaining
        self.retry_after_ms = retry_after_ms
        self.reset_after_ms = reset_after_ms

    def as_tuple(self):
        return (self.policy, self.granted, self.limit, self.remaining, self.retry_after_ms,
                self.reset_after_ms)

    def __eq__(self, other):
        return isinstance(other, Part) and self.as_tuple() == other.as_tuple()

    __hash__ = None

    def __repr__(self):
        return "Part(%r, granted=%d, limit=%d, remaining=%d, retry_after_ms=%d, " \
               "reset_after_ms=%d)" % self.as_tuple()


class Decision:
    """The answer to one limit() or refund() call. See clients/DESIGN.md."""

    __slots__ = ("allowed", "granted", "limit", "remaining", "retry_after_ms",
                 "reset_after_ms", "policy", "binding", "source", "parts", "rule")

    def __init__(self, allowed, granted, limit, remaining, retry_after_ms, reset_after_ms,
                 policy, binding, source, parts, rule):
        self.allowed = allowed
        self.granted = granted
        self.limit = limit
        self.remaining = remaining
        self.retry_after_ms = retry_after_ms
        self.reset_after_ms = reset_after_ms
        self.policy = policy
        self.binding = binding
        self.source = source
        self.parts = parts
        self.rule = rule

    def values(self):
        """Everything but `source` and `rule`: what two backends must agree on."""
        return (self.allowed, self.granted, self.limit, self.remaining, self.retry_after_ms,
                self.reset_after_ms, self.policy, self.binding,
                tuple(p.as_tuple() for p in self.parts))

    def __eq__(self, other):
        return isinstance(other, Decision) and self.values() == other.values() \
            and self.source == other.source

    __hash__ = None

    def __bool__(self):
        return self.allowed

    def __repr__(self):
        return (f"Decision(allowed={self.allowed}, granted={self.granted}, limit={self.limit}, "
                f"remaining={self.remaining}, retry_after_ms={self.retry_after_ms}, "
                f"reset_after_ms={self.reset_after_ms}, policy={self.policy!r}, "
                f"binding={self.binding!r}, source={self.source!r}"
                + (f", parts={list(self.parts)!r})" if self.parts else ")"))


def _secs(ms):
    return -(-ms // 1000) if ms > 0 else 0


def headers(decision):
    """The IETF RateLimit fields, the legacy X-RateLimit-* and, on a denial,
    Retry-After (whole seconds, rounded up, never 0). Returns a dict in the
    order the fields should be sent."""
    d = decision
    rule = d.rule
    if d.parts:
        pol = ", ".join(f'"{part.policy}";q={part.limit};w={_secs(p.window_ms)}'
                        for part, p in zip(d.parts, rule.parts))
    else:
        pol = f'"{d.policy}";q={d.limit};w={_secs(rule.window_ms)}'
    reset = _secs(d.reset_after_ms)
    h = {
        "RateLimit-Policy": pol,
        "RateLimit": f'"{d.binding}";r={d.remaining};t={reset}',
        "X-RateLimit-Limit": str(d.limit),
        "X-RateLimit-Remaining": str(d.remaining),
        "X-RateLimit-Reset": str(reset),
    }
    if not d.allowed and d.retry_after_ms >= 0:
        h["Retry-After"] = str(max(1, _secs(d.retry_after_ms)))
    return h


def violated(decision):
    """Names of the policies that could not take their units."""
    d = decision
    if d.parts:
        names = [p.policy for p in d.parts if p.retry_after_ms != 0]
        return names or [d.binding]
    return [d.policy]


def problem(decision, instance=None):
    """The body of a 429 (application/problem+json) for a denied decision."""
    d = decision
    if d.retry_after_ms < 0:
        detail = f'Request costs more than the "{d.binding}" limit allows.'
    else:
        detail = f'Rate limit "{d.binding}" exceeded; retry in ' \
                 f'{max(1, _secs(d.retry_after_ms))} s.'
    body = {
        "type": QUOTA_EXCEEDED,
        "title": QUOTA_TITLE,
        "status": 429,
        "detail": detail,
        "violated-policies": violated(d),
    }
    if instance is not None:
        body["instance"] = instance
    return body
