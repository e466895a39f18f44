//! The seven AIPerf cache-bust targets and the two benchmark phases: wire names, case-insensitive parsing and serde. Never decides where a marker goes or what it says.

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// AIPerf 0.13.0's `CacheBustTarget` (`aiperf-semantics.md` §1.1). The wire values are the
/// snake_case names; parsing is case-insensitive like AIPerf's `CaseInsensitiveStrEnum`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Target {
    /// No marker; the proxy forwards such requests without parsing them.
    #[default]
    None,
    SystemPrefix,
    SystemSuffix,
    FirstTurnPrefix,
    FirstTurnSuffix,
    WarmupIsolationSystem,
    WarmupIsolationFirstTurn,
}

impl Target {
    /// Every target, in AIPerf's declaration order.
    pub const ALL: [Target; 7] = [
        Target::None,
        Target::SystemPrefix,
        Target::SystemSuffix,
        Target::FirstTurnPrefix,
        Target::FirstTurnSuffix,
        Target::WarmupIsolationSystem,
        Target::WarmupIsolationFirstTurn,
    ];

    /// Every target's wire name, comma-separated: the one list errors and help text print.
    pub fn names() -> String {
        Target::ALL.map(Target::as_str).join(", ")
    }

    /// The wire value (`system_prefix`, ...).
    pub const fn as_str(self) -> &'static str {
        match self {
            Target::None => "none",
            Target::SystemPrefix => "system_prefix",
            Target::SystemSuffix => "system_suffix",
            Target::FirstTurnPrefix => "first_turn_prefix",
            Target::FirstTurnSuffix => "first_turn_suffix",
            Target::WarmupIsolationSystem => "warmup_isolation_system",
            Target::WarmupIsolationFirstTurn => "warmup_isolation_first_turn",
        }
    }

    /// True when the marker goes before the content: both `*_prefix` targets and both
    /// warm-up isolation targets (AIPerf §1.6 "Prefix vs suffix"). `None` is not a prefix.
    pub const fn is_prefix(self) -> bool {
        matches!(
            self,
            Target::SystemPrefix
                | Target::FirstTurnPrefix
                | Target::WarmupIsolationSystem
                | Target::WarmupIsolationFirstTurn
        )
    }

    /// True for the targets aimed at the system prompt (which fall through to the first user
    /// turn when there is none): `system_prefix`, `system_suffix`, `warmup_isolation_system`.
    pub const fn is_system(self) -> bool {
        matches!(
            self,
            Target::SystemPrefix | Target::SystemSuffix | Target::WarmupIsolationSystem
        )
    }

    /// True for `warmup_isolation_system` and `warmup_isolation_first_turn`.
    pub const fn is_warmup_isolation(self) -> bool {
        matches!(
            self,
            Target::WarmupIsolationSystem | Target::WarmupIsolationFirstTurn
        )
    }

    /// True for `none`.
    pub const fn is_none(self) -> bool {
        matches!(self, Target::None)
    }
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown cache-bust target value; the message lists the valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "unknown cache-bust target `{value}`; valid values are: {} (case-insensitive)",
    Target::names()
)]
pub struct ParseTargetError {
    /// The rejected input, as given.
    pub value: String,
}

impl FromStr for Target {
    type Err = ParseTargetError;

    /// Case-insensitive; surrounding ASCII whitespace is ignored (headers, env values).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim_ascii();
        Target::ALL
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| ParseTargetError {
                value: s.to_owned(),
            })
    }
}

impl Serialize for Target {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Target {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// The benchmark phase of a request. The phase is never part of the digest; it only gates the
/// warm-up isolation markers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Phase {
    Warmup,
    #[default]
    Profiling,
}

impl Phase {
    /// Both phases.
    pub const ALL: [Phase; 2] = [Phase::Warmup, Phase::Profiling];

    /// The wire value (`warmup` / `profiling`).
    pub const fn as_str(self) -> &'static str {
        match self {
            Phase::Warmup => "warmup",
            Phase::Profiling => "profiling",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An unknown phase value; the message lists the valid ones.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown phase `{value}`; valid values are: warmup, profiling (case-insensitive)")]
pub struct ParsePhaseError {
    /// The rejected input, as given.
    pub value: String,
}

impl FromStr for Phase {
    type Err = ParsePhaseError;

    /// Case-insensitive; surrounding ASCII whitespace is ignored.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let t = s.trim_ascii();
        Phase::ALL
            .into_iter()
            .find(|v| v.as_str().eq_ignore_ascii_case(t))
            .ok_or_else(|| ParsePhaseError {
                value: s.to_owned(),
            })
    }
}

impl Serialize for Phase {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> Deserialize<'de> for Phase {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = std::borrow::Cow::<'de, str>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_target_is_answered_with_every_name() {
        let e = "bogus".parse::<Target>().unwrap_err().to_string();
        for t in Target::ALL {
            assert!(e.contains(t.as_str()), "{e}");
        }
    }

    #[test]
    fn wire_values_round_trip_case_insensitively() {
        for t in Target::ALL {
            assert_eq!(t.to_string().parse::<Target>(), Ok(t));
            assert_eq!(t.as_str().to_uppercase().parse::<Target>(), Ok(t));
            let json = serde_json::to_string(&t).unwrap();
            assert_eq!(json, format!("\"{}\"", t.as_str()));
            let back: Target = serde_json::from_str(&json.to_uppercase()).unwrap();
            assert_eq!(back, t);
        }
        for p in Phase::ALL {
            assert_eq!(p.to_string().parse::<Phase>(), Ok(p));
            assert_eq!(p.as_str().to_uppercase().parse::<Phase>(), Ok(p));
            let back: Phase = serde_json::from_str(&format!("\"{}\"", p.as_str())).unwrap();
            assert_eq!(back, p);
        }
        assert_eq!(
            " System_Prefix ".parse::<Target>(),
            Ok(Target::SystemPrefix)
        );
        assert_eq!("WarmUp".parse::<Phase>(), Ok(Phase::Warmup));
    }

    #[test]
    fn defaults() {
        assert_eq!(Target::default(), Target::None);
        assert_eq!(Phase::default(), Phase::Profiling);
    }

    #[test]
    fn unknown_values_list_the_valid_ones() {
        let e = "system".parse::<Target>().unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("`system`"), "{msg}");
        for t in Target::ALL {
            assert!(msg.contains(t.as_str()), "{msg} lacks {t}");
        }
        let e = "prod".parse::<Phase>().unwrap_err().to_string();
        assert!(e.contains("`prod`") && e.contains("warmup") && e.contains("profiling"));
        let e = serde_json::from_str::<Target>("\"nope\"")
            .unwrap_err()
            .to_string();
        assert!(e.contains("first_turn_prefix"), "{e}");
        assert!(serde_json::from_str::<Phase>("3").is_err());
    }

    #[test]
    fn classification_matches_aiperf() {
        use Target::*;
        let prefix = [
            SystemPrefix,
            FirstTurnPrefix,
            WarmupIsolationSystem,
            WarmupIsolationFirstTurn,
        ];
        let system = [SystemPrefix, SystemSuffix, WarmupIsolationSystem];
        for t in Target::ALL {
            assert_eq!(t.is_prefix(), prefix.contains(&t), "{t}");
            assert_eq!(t.is_system(), system.contains(&t), "{t}");
            assert_eq!(t.is_warmup_isolation(), t.as_str().starts_with("warmup_"));
            assert_eq!(t.is_none(), t == None);
        }
    }
}
