//! The module's replies read back, for clients: the five-integer reply of
//! the single commands and RL.MULTI's nested one, as the module writes them
//! (`src/commands/reply.rs`) and the Lua twins return them, decoded into the
//! plain values of this crate ([`Decision`]). No Redis types: a client
//! reads its driver's reply value through the [`Reply`] trait.
//!
//! ```text
//! single:  [first, limit, remaining, retry_after_ms, reset_after_ms]
//! RL.MULTI: [first, limit, remaining, retry_after_ms, reset_after_ms, binding,
//!            [[granted, limit, remaining, retry_after_ms, reset_after_ms], ...]]
//! ```
//!
//! `first` is [`Decision::allowed`]: with PARTIAL (and for a refund) the
//! units granted (given back), otherwise 1 when the call was fully granted
//! and 0 when it was not. Each RL.MULTI limit's `granted` is its own units
//! (cost × weight when granted).

use crate::Decision;

/// A reply value as a client's driver gives it: an integer, an array, or
/// anything else. A cheap handle (`Copy`: a reference or a wrapper of one).
pub trait Reply: Copy {
    /// The integer, when the value is one.
    fn int(self) -> Option<i64>;
    /// The number of elements, when the value is an array.
    fn array_len(self) -> Option<usize>;
    /// Element `i`, when the value is an array that long.
    fn get(self, i: usize) -> Option<Self>;
}

/// A reply of another shape than the command's (a wrong length, a
/// non-integer, a negative count, a binding index out of range).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadReply;

/// RL.MULTI's reply: the whole call, the binding limit's index and each
/// limit's own answer, in the order of the call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Multi {
    /// The whole call (`granted` read as for a single command).
    pub whole: Decision,
    /// 0-based index of the binding limit (below `parts.len()`).
    pub binding: usize,
    /// One answer per limit.
    pub parts: Vec<Decision>,
}

/// The units a call was granted, from its reply's first element: the
/// inverse of [`Decision::allowed`] (a refund reads as PARTIAL: `first` is
/// the units given back).
#[inline]
pub fn granted(first: u64, cost: u64, partial: bool) -> u64 {
    if partial {
        first
    } else if first == 1 {
        cost
    } else {
        0
    }
}

fn int<R: Reply>(v: R, i: usize) -> Result<i64, BadReply> {
    v.get(i).and_then(Reply::int).ok_or(BadReply)
}

fn uint<R: Reply>(v: R, i: usize) -> Result<u64, BadReply> {
    u64::try_from(int(v, i)?).map_err(|_| BadReply)
}

/// The five integers from element 0 of `v`, `granted` as sent.
fn five<R: Reply>(v: R) -> Result<Decision, BadReply> {
    Ok(Decision {
        granted: uint(v, 0)?,
        limit: uint(v, 1)?,
        remaining: uint(v, 2)?,
        retry_after_ms: int(v, 3)?,
        reset_after_ms: uint(v, 4)?,
    })
}

/// A single command's reply (exactly five integers) for a call of `cost`
/// (a refund: `n`, with `partial` true).
pub fn single<R: Reply>(v: R, cost: u64, partial: bool) -> Result<Decision, BadReply> {
    if v.array_len() != Some(5) {
        return Err(BadReply);
    }
    let d = five(v)?;
    Ok(Decision { granted: granted(d.granted, cost, partial), ..d })
}

/// RL.MULTI's reply for a call of `n` limits (seven elements, the last an
/// array of `n` arrays of at least five integers).
pub fn multi<R: Reply>(v: R, n: usize, cost: u64, partial: bool) -> Result<Multi, BadReply> {
    let list = v.get(6).filter(|_| v.array_len() == Some(7)).ok_or(BadReply)?;
    if list.array_len() != Some(n) {
        return Err(BadReply);
    }
    let mut parts = Vec::with_capacity(n);
    for i in 0..n {
        let p = list.get(i).ok_or(BadReply)?;
        if p.array_len().is_none_or(|l| l < 5) {
            return Err(BadReply);
        }
        parts.push(five(p)?);
    }
    let binding = usize::try_from(uint(v, 5)?).ok().filter(|&b| b < n).ok_or(BadReply)?;
    let d = five(v)?;
    Ok(Multi { whole: Decision { granted: granted(d.granted, cost, partial), ..d }, binding, parts })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A reply value for the tests: what a driver's would be.
    #[derive(Debug)]
    enum V {
        Int(i64),
        Arr(Vec<V>),
        Nil,
    }

    impl<'a> Reply for &'a V {
        fn int(self) -> Option<i64> {
            match self {
                V::Int(i) => Some(*i),
                _ => None,
            }
        }
        fn array_len(self) -> Option<usize> {
            match self {
                V::Arr(a) => Some(a.len()),
                _ => None,
            }
        }
        fn get(self, i: usize) -> Option<&'a V> {
            match self {
                V::Arr(a) => a.get(i),
                _ => None,
            }
        }
    }

    fn ints(xs: &[i64]) -> V {
        V::Arr(xs.iter().map(|&x| V::Int(x)).collect())
    }

    fn d(granted: u64, limit: u64, remaining: u64, retry_after_ms: i64, reset_after_ms: u64) -> Decision {
        Decision { granted, limit, remaining, retry_after_ms, reset_after_ms }
    }

    #[test]
    fn the_first_element_reads_back_as_decision_allowed_writes_it() {
        for cost in [0, 1, 3, crate::MAX_ARG] {
            for partial in [false, true] {
                for g in [0, cost / 2, cost] {
                    let sent = if partial || g == cost { g } else { 0 };
                    let x = d(sent, 9, 1, 0, 5);
                    assert_eq!(granted(x.allowed(cost, partial), cost, partial), x.granted, "{cost} {partial} {g}");
                }
            }
        }
    }

    #[test]
    fn a_single_reply_is_five_integers() {
        assert_eq!(single(&ints(&[1, 10, 7, 0, 300]), 3, false), Ok(d(3, 10, 7, 0, 300)));
        assert_eq!(single(&ints(&[0, 10, 0, 250, 900]), 3, false), Ok(d(0, 10, 0, 250, 900)));
        assert_eq!(single(&ints(&[2, 10, 0, 100, 900]), 3, true), Ok(d(2, 10, 0, 100, 900)));
        assert_eq!(single(&ints(&[0, 1, 1, -1, 0]), 2, false), Ok(d(0, 1, 1, -1, 0)));
        for bad in [ints(&[1, 10, 7, 0]), ints(&[1, 10, 7, 0, 300, 1]), ints(&[1, -10, 7, 0, 300]), V::Nil] {
            assert_eq!(single(&bad, 1, false), Err(BadReply), "{bad:?}");
        }
        let nested = V::Arr(vec![V::Int(1), V::Int(1), V::Nil, V::Int(0), V::Int(0)]);
        assert_eq!(single(&nested, 1, false), Err(BadReply));
    }

    #[test]
    fn a_multi_reply_has_the_whole_the_binding_and_each_part() {
        let reply = |binding: i64, parts: Vec<V>| {
            let mut a: Vec<V> = [1, 5, 2, 0, 700].iter().map(|&x| V::Int(x)).collect();
            a.push(V::Int(binding));
            a.push(V::Arr(parts));
            V::Arr(a)
        };
        let ok = reply(1, vec![ints(&[2, 10, 8, 0, 200]), ints(&[2, 5, 2, 0, 700])]);
        let m = multi(&ok, 2, 2, false).unwrap();
        assert_eq!(m.whole, d(2, 5, 2, 0, 700));
        assert_eq!(m.binding, 1);
        assert_eq!(m.parts, vec![d(2, 10, 8, 0, 200), d(2, 5, 2, 0, 700)]);
        assert_eq!(multi(&ok, 3, 2, false), Err(BadReply), "a part missing");
        let out_of_range = reply(2, vec![ints(&[2, 10, 8, 0, 200]), ints(&[2, 5, 2, 0, 700])]);
        assert_eq!(multi(&out_of_range, 2, 2, false), Err(BadReply));
        let short_part = reply(0, vec![ints(&[2, 10, 8, 0]), ints(&[2, 5, 2, 0, 700])]);
        assert_eq!(multi(&short_part, 2, 2, false), Err(BadReply));
        assert_eq!(multi(&ints(&[1, 5, 2, 0, 700, 0]), 1, 1, false), Err(BadReply));
    }
}
