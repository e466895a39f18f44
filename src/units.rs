//! Units people write in configuration: byte counts ([`ByteSize`]: `"64MiB"`, `"512KiB"`, a bare
//! integer) and durations ([`duration`]: `"5s"`, `"250ms"`), parsed, printed and (de)serialised
//! the same way for the configuration, the mock and the CLI. Owns only the units; never reads a
//! file, the environment or any other part of the configuration.

pub mod duration;

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

/// A byte count written as `"64MiB"`, `"512KiB"`, `"1GB"` or a bare integer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct ByteSize(pub u64);

impl ByteSize {
    pub fn as_u64(self) -> u64 {
        self.0
    }
}

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
        let (num, unit) = t.split_at(split);
        let n: u64 = num
            .parse()
            .map_err(|_| format!("`{s}` is not a size like \"64MiB\""))?;
        let mult: u64 = match unit.trim().to_ascii_lowercase().as_str() {
            "" | "b" => 1,
            "k" | "kb" => 1_000,
            "kib" => 1 << 10,
            "m" | "mb" => 1_000_000,
            "mib" => 1 << 20,
            "g" | "gb" => 1_000_000_000,
            "gib" => 1 << 30,
            other => {
                return Err(format!(
                    "unknown size unit `{other}` in `{s}` (use B, KiB, MiB, GiB, KB, MB, GB)"
                ))
            }
        };
        n.checked_mul(mult)
            .map(ByteSize)
            .ok_or_else(|| format!("size `{s}` is too large"))
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        for (unit, m) in [("GiB", 1u64 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)] {
            if n >= m && n % m == 0 {
                return write!(f, "{}{unit}", n / m);
            }
        }
        write!(f, "{n}B")
    }
}

impl Serialize for ByteSize {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(ByteSize(n)),
            Raw::S(s) => s.parse().map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_sizes_parse_and_print() {
        for (s, n) in [
            ("64MiB", 64u64 << 20),
            ("1KiB", 1024),
            ("10", 10),
            ("2GB", 2_000_000_000),
            ("3 MiB", 3 << 20),
        ] {
            assert_eq!(s.parse::<ByteSize>().unwrap(), ByteSize(n), "{s}");
        }
        assert!("MiB".parse::<ByteSize>().is_err());
        assert_eq!(ByteSize(64 << 20).to_string(), "64MiB");
    }
}
