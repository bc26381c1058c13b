// HTTP fields for a Decision: the IETF draft (draft-ietf-httpapi-ratelimit-
// headers-11) RateLimit-Policy / RateLimit, the legacy X-RateLimit-*, and
// Retry-After; and the RFC 9457 problem body for a 429.

function ceilS(ms) { return Math.ceil(ms / 1000); }

/** headers(decision) -> {field: value}, in a fixed order. */
export function headers(d) {
  const rule = d.rule;
  let policy;
  if (d.parts.length > 0) {
    let s = '';
    for (let i = 0; i < d.parts.length; i++) {
      if (i) s += ', ';
      s += `"${rule.parts[i].name}";q=${d.parts[i].limit};w=${ceilS(rule.parts[i].windowMs)}`;
    }
    policy = s;
  } else {
    policy = `"${rule.name}";q=${d.limit};w=${ceilS(rule.windowMs)}`;
  }
  const reset = String(ceilS(d.resetAfterMs));
  const h = {
    'RateLimit-Policy': policy,
    RateLimit: `"${d.binding}";r=${d.remaining};t=${reset}`,
    'X-RateLimit-Limit': String(d.limit),
    'X-RateLimit-Remaining': String(d.remaining),
    'X-RateLimit-Reset': reset,
  };
  if (!d.allowed && d.retryAfterMs >= 0) h['Retry-After'] = String(Math.max(1, ceilS(d.retryAfterMs)));
  return h;
}

/** The 429 body (application/problem+json) for a denied decision. */
export function problem(d, instance) {
  let violated;
  if (d.parts.length > 0) {
    violated = [];
    for (const p of d.parts) if (p.retryAfterMs !== 0) violated.push(p.policy);
  } else {
    violated = [d.policy];
  }
  const detail = d.retryAfterMs < 0
    ? `Request costs more than the "${d.binding}" limit allows.`
    : `Rate limit "${d.binding}" exceeded; retry in ${Math.max(1, ceilS(d.retryAfterMs))} s.`;
  const body = {
    type: 'https://iana.org/assignments/http-problem-types#quota-exceeded',
    title: 'Request cannot be satisfied as assigned quota has been exceeded',
    status: 429,
    detail,
    'violated-policies': violated,
  };
  if (instance !== undefined) body.instance = instance;
  return body;
}
