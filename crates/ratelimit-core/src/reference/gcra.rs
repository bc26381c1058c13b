//! The reference model of CL.THROTTLE: redis-cell 0.5's computation restated
//! with its own representations, never the implementation's `i128`
//! shortcuts: a duration is normalised `(seconds: i64, nanos: i32)` of the
//! same sign (as the `time` crate keeps it), instants are durations since
//! the epoch, whole microseconds and milliseconds are read from the two
//! parts, and the seconds reply goes through `f64` from the two parts.
//! A store keeps `(tat, expiry ms)` and forgets a key once its millisecond
//! is past, as the server does (`now_ms > expiry`).

/// A normalised duration: both parts of one sign, `|nanos| < 10⁹`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Dur {
    pub secs: i64,
    pub nanos: i32,
}

impl Dur {
    pub fn from_ns(ns: i64) -> Dur {
        Dur { secs: ns / 1_000_000_000, nanos: (ns % 1_000_000_000) as i32 }
    }
    fn normalise(secs: i64, nanos: i64) -> Dur {
        let mut s = secs + nanos.div_euclid(1_000_000_000);
        let mut n = nanos.rem_euclid(1_000_000_000);
        if s < 0 && n > 0 {
            s += 1;
            n -= 1_000_000_000;
        }
        Dur { secs: s, nanos: n as i32 }
    }
    pub fn plus(self, o: Dur) -> Dur {
        Dur::normalise(self.secs + o.secs, i64::from(self.nanos) + i64::from(o.nanos))
    }
    pub fn minus(self, o: Dur) -> Dur {
        self.plus(o.negated())
    }
    pub fn negated(self) -> Dur {
        Dur { secs: -self.secs, nanos: -self.nanos }
    }
    pub fn is_negative(self) -> bool {
        self.secs < 0 || self.nanos < 0
    }
    fn cmp_key(self) -> (i64, i32) {
        (self.secs, self.nanos)
    }
    pub fn gt(self, o: Dur) -> bool {
        self.cmp_key() > o.cmp_key()
    }
    pub fn whole_us(self) -> i128 {
        i128::from(self.secs) * 1_000_000 + i128::from(self.nanos / 1000)
    }
    pub fn whole_ms(self) -> i128 {
        i128::from(self.secs) * 1000 + i128::from(self.nanos / 1_000_000)
    }
    pub fn reply_seconds(self) -> i64 {
        let f = self.secs as f64 + f64::from(self.nanos) / 1e9;
        let mut s = f as i64;
        if self.nanos / 1_000_000 > 0 {
            s += 1;
        }
        s
    }
    pub fn as_u64_ns(self) -> u64 {
        (self.secs as u64) * 1_000_000_000 + self.nanos as u64
    }
}

/// redis-cell's `Zero rates are not supported`.
#[derive(Debug, PartialEq, Eq)]
pub struct ZeroRate;

/// The key redis-cell keeps.
#[derive(Clone, Debug, Default)]
pub struct Store {
    /// (tat ns, absolute expiry ms)
    pub key: Option<(u64, i128)>,
}

/// The five integers redis-cell answers for `max_burst count period
/// quantity` at `now_ns` (Err for "Zero rates are not supported"),
/// updating the store. Only for arguments in the implementation's domain
/// (non-negative, no product past i64).
pub fn throttle(
    st: &mut Store,
    max_burst: i64,
    count: i64,
    period: i64,
    quantity: i64,
    now_ns: u64,
) -> Result<[i64; 5], ZeroRate> {
    let ns = i128::from(period) * 1_000_000_000;
    let emission = if count == 0 || ns == 0 { Dur::from_ns(0) } else { Dur::from_ns((ns as f64 / count as f64) as i64) };
    if emission == Dur::from_ns(0) {
        return Err(ZeroRate);
    }
    let e_ns = i64::from(emission.nanos) + emission.secs * 1_000_000_000;
    let dvt = Dur::from_ns(e_ns * (max_burst + 1));
    let increment = Dur::from_ns(e_ns * quantity);
    let now = Dur::from_ns(now_ns as i64);
    let now_ms = now.whole_ms();
    if let Some((_, exp)) = st.key {
        if now_ms > exp {
            st.key = None;
        }
    }
    let tat = match st.key {
        None => now,
        Some((t, _)) => Dur::from_ns(t as i64),
    };
    let new_tat = if now.gt(tat) { now.plus(increment) } else { tat.plus(increment) };
    let allow_at = new_tat.minus(dvt);
    let diff = now.minus(allow_at);
    let mut retry = Dur { secs: -1, nanos: 0 };
    let limited;
    let ttl;
    if diff.is_negative() {
        if !increment.gt(dvt) {
            retry = diff.negated();
        }
        limited = true;
        ttl = tat.minus(now);
    } else {
        ttl = new_tat.minus(now);
        st.key = Some((new_tat.as_u64_ns(), now_ms + ttl.whole_ms()));
        limited = false;
    }
    let next = dvt.minus(ttl);
    let mut remaining = 0;
    if next.gt(emission.negated()) {
        remaining = (next.whole_us() as f64 / emission.whole_us() as f64) as i64;
    }
    Ok([i64::from(limited), max_burst + 1, remaining, retry.reply_seconds(), ttl.reply_seconds()])
}
