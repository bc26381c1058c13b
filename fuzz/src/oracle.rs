//! Independent statements of the argument grammars, and the check of the
//! parser (`args::parse`, `args::parse_multi`) against them.

use crate::args::{Arg, ArgError, Call, Kind, LimitSpec, MultiCall, MAX_LIMITS};
use crate::core::MAX_ARG;

/// An independent statement of the argument grammar (docs/contract.md,
/// "Ranges and numbers" and "Errors", and args.rs's documented "ASCII
/// digits, at most 16").
///
/// Leading zeros ("01"): Redis's own integer arguments refuse them; whether
/// this module does is args.rs's documented choice (its unit tests pin it),
/// so the oracle follows it and checks everything else independently.
fn oracle_num(s: &[u8], min: u64) -> Option<u64> {
    let leading_zeros_ok = crate::args::parse_num(b"01", 0).is_some();
    if s.is_empty() || s.len() > 16 || !s.iter().all(u8::is_ascii_digit) {
        return None;
    }
    if s.len() > 1 && s[0] == b'0' && !leading_zeros_ok {
        return None;
    }
    let v: u128 = std::str::from_utf8(s).ok()?.parse().ok()?;
    (u128::from(min)..=u128::from(MAX_ARG)).contains(&v).then_some(v as u64)
}

/// What the parser must answer: `Err(None)` arity, `Err(Some(i))` the i-th
/// positional number (i = positional count: COST, + 1: REFUND),
/// `Err(Some(usize::MAX))` syntax. REFUND n (1 or more) excludes COST,
/// PARTIAL and DRYRUN.
pub fn oracle_parse(args: &[&[u8]], npos: usize) -> Result<Call, Option<usize>> {
    oracle_parse_with(args, npos, false)
}

/// [`oracle_parse`], and with `from_first` the FROMFIRST option of
/// RL.FIXEDWINDOW: at most once, anywhere after the numbers, with a grant
/// or a refund; it sets the third number to 1.
pub fn oracle_parse_with(args: &[&[u8]], npos: usize, from_first: bool) -> Result<Call, Option<usize>> {
    if args.len() < npos {
        return Err(None);
    }
    let mut nums = [0u64; 3];
    for i in 0..npos {
        nums[i] = oracle_num(args[i], 1).ok_or(Some(i))?;
    }
    let (mut cost, mut partial, mut dryrun, mut refund) = (None, false, false, None);
    let mut force = false;
    let mut first = false;
    let mut i = npos;
    while i < args.len() {
        let up = args[i].to_ascii_uppercase();
        match &up[..] {
            b"FROMFIRST" if from_first && !first => {
                first = true;
                nums[2] = 1;
                i += 1;
            }
            b"REFUND" if refund.is_none() && cost.is_none() && !partial && !dryrun && !force => {
                let v = args.get(i + 1).ok_or(Some(usize::MAX))?;
                refund = Some(oracle_num(v, 1).ok_or(Some(npos + 1))?);
                i += 2;
            }
            _ if refund.is_some() => return Err(Some(usize::MAX)),
            b"COST" if cost.is_none() => {
                let v = args.get(i + 1).ok_or(Some(usize::MAX))?;
                cost = Some(oracle_num(v, 0).ok_or(Some(npos))?);
                i += 2;
            }
            b"PARTIAL" if !partial && !force => {
                partial = true;
                i += 1;
            }
            b"DRYRUN" if !dryrun => {
                dryrun = true;
                i += 1;
            }
            // FORCE: a debit, never with PARTIAL (nor REFUND, above)
            b"FORCE" if !force && !partial => {
                force = true;
                i += 1;
            }
            _ => return Err(Some(usize::MAX)),
        }
    }
    Ok(Call { nums, cost: cost.unwrap_or(1), partial, dryrun, refund: refund.unwrap_or(0), force })
}

/// Runs `args::parse` and checks it against the oracle, the argument an
/// error names included.
pub fn parse_checked(args: &[&[u8]], positional: &[Arg]) -> Option<Call> {
    parse_checked_with(args, positional, false)
}

/// [`parse_checked`] of the parser with FROMFIRST (`args::parse_fixedwindow`)
/// when `from_first`.
pub fn parse_checked_with(args: &[&[u8]], positional: &[Arg], from_first: bool) -> Option<Call> {
    let got = if from_first {
        crate::args::parse_fixedwindow(args.iter().copied())
    } else {
        crate::args::parse(args.iter().copied(), positional)
    };
    // The module's path for a call of numbers only must answer the same
    // (it takes that path only when the count says there are no options).
    if args.len() == positional.len() || !from_first {
        assert_eq!(crate::args::parse_exact(args, positional), got, "parse_exact, args {args:?}");
    }
    let want = oracle_parse_with(args, positional.len(), from_first);
    match (&got, &want) {
        (Ok(g), Ok(w)) => assert_eq!(g, w, "args {args:?}"),
        (Err(ArgError::Arity), Err(None)) => {}
        (Err(ArgError::Syntax), Err(Some(usize::MAX))) => {}
        (Err(ArgError::Number(a)), Err(Some(i))) if *i < positional.len() => {
            assert_eq!(*a, positional[*i], "args {args:?}");
        }
        (Err(ArgError::Number(a)), Err(Some(i))) if *i == positional.len() => {
            assert_eq!(*a, Arg::Cost, "args {args:?}");
        }
        (Err(ArgError::Number(a)), Err(Some(i))) if *i == positional.len() + 1 => {
            assert_eq!(*a, Arg::Refund, "args {args:?}");
        }
        _ => panic!("args {args:?}: parser {got:?}, oracle {want:?}"),
    }
    got.ok()
}

/// The RL.MULTI grammar (docs/contract.md, "RL.MULTI"), stated by index.
pub fn oracle_multi(a: &[&[u8]]) -> Result<MultiCall, ArgError> {
    use ArgError::*;
    if a.len() < 5 {
        return Err(Arity);
    }
    let up = |i: usize| a.get(i).map(|s| s.to_ascii_uppercase());
    let n = oracle_num(a[0], 1).filter(|&n| n <= 16).ok_or(Number(Arg::NumKeys))? as usize;
    if a.len() < 1 + n {
        return Err(LimitCount);
    }
    let keys = &a[1..1 + n];
    // Each limit as (kind, numbers, weight), typed at the end.
    let mut limits = [(Kind::TokenBucket, [0u64; 3], 1u64); MAX_LIMITS];
    let mut call = MultiCall::<MAX_LIMITS>::new();
    call.n = n;
    let is_opt = |w: &[u8]| matches!(w, b"COST" | b"PARTIAL" | b"DRYRUN" | b"REFUND" | b"FORCE");
    let mut i = 1 + n;
    // Each limit's CHECK / SHADOW flags, by its index `li`.
    let mut flags = [0u8; MAX_LIMITS];
    for (li, limit) in limits.iter_mut().take(n).enumerate() {
        let Some(w) = up(i) else { return Err(LimitCount) };
        let (kind, args): (Kind, &[Arg]) = match &w[..] {
            b"TOKENBUCKET" => (Kind::TokenBucket, &[Arg::Capacity, Arg::Rate, Arg::PeriodMs]),
            b"SLIDINGLOG" => (Kind::SlidingLog, &[Arg::Limit, Arg::WindowMs]),
            b"SLIDINGCOUNTER" => (Kind::SlidingCounter, &[Arg::Limit, Arg::WindowMs]),
            b"FIXEDWINDOW" => (Kind::FixedWindow, &[Arg::Limit, Arg::WindowMs]),
            b"CONCURRENCY" => (Kind::Concurrency, &[Arg::Limit, Arg::LeaseMs]),
            w if is_opt(w) => return Err(LimitCount),
            _ => return Err(Syntax),
        };
        limit.0 = kind;
        for (k, &arg) in args.iter().enumerate() {
            let v = a.get(i + 1 + k).ok_or(Syntax)?;
            limit.1[k] = oracle_num(v, 1).ok_or(Number(arg))?;
        }
        i += 1 + args.len();
        // A concurrency limit's id: the next word, whatever it is (its hash
        // kept in the third number).
        if kind == Kind::Concurrency {
            limit.1[2] = crate::core::concurrency::id_hash(a.get(i).ok_or(Syntax)?);
            i += 1;
        }
        if up(i).as_deref() == Some(b"WEIGHT") {
            let v = a.get(i + 1).ok_or(Syntax)?;
            limit.2 = oracle_num(v, 1).ok_or(Number(Arg::Weight))?;
            i += 2;
        }
        // A fixed window's FROMFIRST: after its WEIGHT, once.
        if kind == Kind::FixedWindow && up(i).as_deref() == Some(b"FROMFIRST") {
            limit.1[2] = 1;
            i += 1;
        }
        // Then CHECK, then SHADOW, each at most once and in that order.
        for (word, flag) in [(&b"CHECK"[..], crate::core::multi::CHECK), (b"SHADOW", crate::core::multi::SHADOW)] {
            if up(i).as_deref() == Some(word) {
                flags[li] |= flag;
                i += 1;
            }
        }
    }
    let (mut cost, mut refund) = (None, None);
    while let Some(w) = up(i) {
        let opts_taken = cost.is_some() || call.partial || call.dryrun || call.force;
        match &w[..] {
            b"COST" if cost.is_none() && refund.is_none() => {
                cost = Some(oracle_num(a.get(i + 1).ok_or(Syntax)?, 0).ok_or(Number(Arg::Cost))?);
                i += 2;
            }
            b"PARTIAL" if !call.partial && refund.is_none() && !call.force => {
                call.partial = true;
                i += 1;
            }
            b"FORCE" if !call.force && refund.is_none() && !call.partial => {
                call.force = true;
                i += 1;
            }
            b"DRYRUN" if !call.dryrun && refund.is_none() => {
                call.dryrun = true;
                i += 1;
            }
            b"REFUND" if refund.is_none() && !opts_taken => {
                refund = Some(oracle_num(a.get(i + 1).ok_or(Syntax)?, 1).ok_or(Number(Arg::Refund))?);
                i += 2;
            }
            b"TOKENBUCKET" | b"SLIDINGLOG" | b"SLIDINGCOUNTER" | b"FIXEDWINDOW" | b"CONCURRENCY" => return Err(LimitCount),
            _ => return Err(Syntax),
        }
    }
    call.cost = cost.unwrap_or(1);
    call.refund = refund.unwrap_or(0);
    call.flags = flags;
    call.flagged = flags.iter().any(|&f| f != 0);
    if call.force && limits[..n].iter().any(|l| l.0 == Kind::Concurrency) {
        // no debit past a concurrency limit
        return Err(Syntax);
    }
    if call.flagged && (call.force || call.refund > 0) {
        // a debit or a refund applies to every limit: none may only look
        // (CHECK) or take what fits (SHADOW)
        return Err(Syntax);
    }
    for x in 0..n {
        for y in 0..x {
            if keys[x] == keys[y] {
                return Err(DuplicateKey);
            }
        }
    }
    let (units, which) = if call.refund > 0 { (call.refund, Arg::Refund) } else { (call.cost, Arg::Cost) };
    if limits[..n].iter().any(|l| u128::from(units) * u128::from(l.2) > u128::from(MAX_ARG)) {
        return Err(Product(which));
    }
    {
        use crate::core::multi::Params;
        use crate::core::{concurrency as cc, fixedwindow as fw, slidingcounter as sc, slidinglog as sl, tokenbucket as tb};
        for (spec, &(kind, [x, y, z], weight)) in call.limits.iter_mut().zip(&limits[..n]) {
            let params = match kind {
                Kind::TokenBucket => Params::TokenBucket(tb::Params { capacity: x, rate: y, period_ms: z }),
                Kind::SlidingLog => Params::SlidingLog(sl::Params { limit: x, window_ms: y }),
                Kind::SlidingCounter => Params::SlidingCounter(sc::Params { limit: x, window_ms: y }),
                Kind::FixedWindow => Params::FixedWindow(fw::Params { limit: x, window_ms: y, from_first: z == 1 }),
                Kind::Concurrency => Params::Concurrency(cc::Params { limit: x, lease_ms: y, id_hash: z }),
            };
            *spec = LimitSpec { params, weight };
        }
    }
    // options, WEIGHT and a limit's CHECK / SHADOW follow the keys: a key
    // may be named `cost`
    call.plain = limits[..n].iter().all(|l| l.0 != Kind::SlidingLog && l.0 != Kind::Concurrency)
        && !a[1 + n..].iter().any(|w| {
            matches!(
                &w.to_ascii_uppercase()[..],
                b"WEIGHT" | b"COST" | b"PARTIAL" | b"DRYRUN" | b"REFUND" | b"FORCE" | b"CHECK" | b"SHADOW"
            )
        });
    Ok(call)
}
