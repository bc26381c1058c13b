//! Redis keys for rate limits, and the Redis Cluster slot of a key.
//!
//! A key is `prefix:{tag}:rest`: the part inside the braces is the hash tag,
//! the only part Redis Cluster hashes, so every key built with the same tag
//! lands in the same slot.

use crate::error::{Error, Result};

/// CRC16/XMODEM (polynomial 0x1021), the hash Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 { (crc << 1) ^ 0x1021 } else { crc << 1 };
        }
    }
    crc
}

/// The cluster slot (0..16383) of a key, hash tags honoured as Redis does.
pub fn key_slot(key: impl AsRef<[u8]>) -> u16 {
    let b = key.as_ref();
    if let Some(open) = b.iter().position(|&c| c == b'{') {
        if let Some(len) = b[open + 1..].iter().position(|&c| c == b'}') {
            if len > 0 {
                return crc16(&b[open + 1..open + 1 + len]) & 16383;
            }
        }
    }
    crc16(b) & 16383
}

fn part<'a>(what: &str, s: &'a str) -> Result<&'a str> {
    if s.is_empty() {
        return Err(Error::Invalid(format!("{what} must not be empty")));
    }
    if s.contains(['{', '}']) {
        return Err(Error::Invalid(format!("{what} must not contain {{ or }}: {s:?}")));
    }
    Ok(s)
}

/// `make_key(tag, parts)` → `rl:{tag}:part:part`. Every key built with the
/// same tag shares a cluster slot.
pub fn make_key(tag: &str, parts: &[&str]) -> Result<String> {
    make_key_with_prefix("rl", tag, parts)
}

/// [`make_key`] with a prefix of your own instead of `rl`.
pub fn make_key_with_prefix(prefix: &str, tag: &str, parts: &[&str]) -> Result<String> {
    let mut k = format!("{}:{{{}}}", part("prefix", prefix)?, part("tag", tag)?);
    for p in parts {
        k.push(':');
        k.push_str(part("key part", p)?);
    }
    Ok(k)
}

/// `Err(Error::CrossSlot)` unless every key maps to the same cluster slot.
pub fn assert_same_slot<K: AsRef<str>>(keys: &[K]) -> Result<()> {
    let Some(first) = keys.first() else { return Ok(()) };
    let s0 = key_slot(first.as_ref());
    for k in &keys[1..] {
        let s = key_slot(k.as_ref());
        if s != s0 {
            return Err(Error::CrossSlot(format!(
                "keys {:?} (slot {s0}) and {:?} (slot {s}) cannot share a cluster slot; \
                 put the shared part in a hash tag, e.g. rl:{{tenant42}}:user7",
                first.as_ref(),
                k.as_ref()
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_as_redis_computes_them() {
        // CLUSTER KEYSLOT answers (Redis docs and the other libraries' tests)
        assert_eq!(key_slot("foo"), 12182);
        assert_eq!(key_slot("123456789"), 12739);
        assert_eq!(key_slot("{user1000}.following"), key_slot("user1000"));
        assert_eq!(key_slot("foo{}{bar}"), key_slot("foo{}{bar}"));
        assert_eq!(key_slot("foo{}{bar}"), crc16(b"foo{}{bar}") & 16383);
        assert_eq!(key_slot("foo{{bar}}zap"), key_slot("{bar"));
        assert_eq!(key_slot("foo{bar}{zap}"), key_slot("bar"));
    }

    #[test]
    fn keys_with_their_tag() {
        assert_eq!(make_key("tenant42", &["user7"]).unwrap(), "rl:{tenant42}:user7");
        assert_eq!(make_key_with_prefix("x", "t", &[]).unwrap(), "x:{t}");
        assert!(make_key("", &[]).is_err());
        assert!(make_key("a{b", &[]).is_err());
        assert!(make_key("a", &["b}"]).is_err());
        assert!(make_key("a", &[""]).is_err());
        assert!(assert_same_slot(&["rl:{t}:a", "rl:{t}:b"]).is_ok());
        assert!(matches!(assert_same_slot(&["a", "b"]), Err(Error::CrossSlot(_))));
    }
}
