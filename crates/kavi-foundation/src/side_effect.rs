//! Side-effect classes: what running a skill may touch.
//!
//! A proposal names one class, or several where the skill needs them: a skill that calls an API
//! with a token is NETWORK and SECRET_READ (`side_effect = ["NETWORK", "SECRET_READ"]`). Its
//! confinement is the union of its classes' profiles, and anything but READ_ONLY alone needs
//! confirmation at run time. READ_ONLY says the skill touches nothing, so it stands alone.
//! A set is written in the ledger and in `SIDE_EFFECT` declarations as its names joined by `+`,
//! in a fixed order (`NETWORK+SECRET_READ`).

use std::fmt;

use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// One side-effect class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SideEffect {
    ReadOnly,
    FileWrite,
    Network,
    SecretRead,
}

/// Every class, in the order a set names them.
const ALL: [SideEffect; 4] = [
    SideEffect::ReadOnly,
    SideEffect::FileWrite,
    SideEffect::Network,
    SideEffect::SecretRead,
];

impl SideEffect {
    pub fn as_str(self) -> &'static str {
        match self {
            SideEffect::ReadOnly => "READ_ONLY",
            SideEffect::FileWrite => "FILE_WRITE",
            SideEffect::Network => "NETWORK",
            SideEffect::SecretRead => "SECRET_READ",
        }
    }

    pub fn named(name: &str) -> Option<Self> {
        ALL.into_iter().find(|class| class.as_str() == name)
    }

    fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// The classes a skill is proposed with: never empty, READ_ONLY only on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SideEffects(u8);

impl SideEffects {
    /// The set of `classes`; an error says why it is not a valid one.
    pub fn of(classes: &[SideEffect]) -> Result<Self, String> {
        let set = Self(classes.iter().fold(0, |bits, class| bits | class.bit()));
        if classes.is_empty() {
            return Err("`side_effect` names no class".into());
        }
        if set.contains(SideEffect::ReadOnly) && !set.is_read_only() {
            return Err(format!(
                "READ_ONLY cannot be combined with other classes ({set}): a skill that touches \
                 something is not read-only"
            ));
        }
        Ok(set)
    }

    /// A set as the ledger writes it (`NETWORK+SECRET_READ`).
    pub fn parse(text: &str) -> Result<Self, String> {
        let classes = text
            .split('+')
            .map(|name| {
                SideEffect::named(name).ok_or_else(|| {
                    format!(
                        "unknown side-effect class `{name}`; the classes are {}",
                        ALL.map(SideEffect::as_str).join(", ")
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        Self::of(&classes)
    }

    pub fn contains(self, class: SideEffect) -> bool {
        self.0 & class.bit() != 0
    }

    /// Only READ_ONLY: runs without confirmation.
    pub fn is_read_only(self) -> bool {
        self == SideEffect::ReadOnly.into()
    }

    pub fn iter(self) -> impl Iterator<Item = SideEffect> {
        ALL.into_iter().filter(move |class| self.contains(*class))
    }

    /// Every class of both (what a chain of two skills may touch): READ_ONLY only when both are.
    pub fn union(self, other: Self) -> Self {
        let both = Self(self.0 | other.0);
        if both.is_read_only() {
            both
        } else {
            Self(both.0 & !SideEffect::ReadOnly.bit())
        }
    }
}

impl From<SideEffect> for SideEffects {
    fn from(class: SideEffect) -> Self {
        Self(class.bit())
    }
}

impl fmt::Display for SideEffects {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.iter().map(SideEffect::as_str).collect();
        f.write_str(&names.join("+"))
    }
}

impl Serialize for SideEffects {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// A class name, a `+`-joined set, or an array of class names.
impl<'de> Deserialize<'de> for SideEffects {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Classes;
        impl<'de> Visitor<'de> for Classes {
            type Value = SideEffects;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a side-effect class, or an array of them")
            }

            fn visit_str<E: de::Error>(self, text: &str) -> Result<SideEffects, E> {
                SideEffects::parse(text).map_err(E::custom)
            }

            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<SideEffects, A::Error> {
                let mut classes = Vec::new();
                while let Some(class) = seq.next_element::<SideEffect>()? {
                    classes.push(class);
                }
                SideEffects::of(&classes).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_any(Classes)
    }
}

/// What [`SideEffects`] reads: one class, a `+`-joined set, or an array of classes.
impl schemars::JsonSchema for SideEffects {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "SideEffects".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let class = generator.subschema_for::<SideEffect>();
        // The names themselves, not a shape of names: an editor completes one, and refuses a
        // misspelt one (`READ_ONLYY`) as the loader does, joined or not.
        let name = ALL.map(SideEffect::as_str).join("|");
        let joined = format!("^({name})(\\+({name}))+$");
        schemars::json_schema!({
            "description": "A side-effect class, several joined by `+` (`NETWORK+SECRET_READ`), or an array of them",
            "anyOf": [
                class.clone(),
                { "type": "string", "pattern": joined },
                { "type": "array", "items": class, "minItems": 1 }
            ]
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_union_is_read_only_only_when_both_are() {
        let read = SideEffects::parse("READ_ONLY").unwrap();
        let write = SideEffects::parse("FILE_WRITE").unwrap();
        let net = SideEffects::parse("NETWORK+SECRET_READ").unwrap();
        assert_eq!(read.union(read), read);
        assert_eq!(read.union(write), write);
        assert_eq!(
            write.union(net).to_string(),
            "FILE_WRITE+NETWORK+SECRET_READ"
        );
    }

    #[test]
    fn a_set_is_named_in_a_fixed_order_and_read_back() {
        let set = SideEffects::of(&[SideEffect::SecretRead, SideEffect::Network]).unwrap();
        assert_eq!(set.to_string(), "NETWORK+SECRET_READ");
        assert_eq!(SideEffects::parse("SECRET_READ+NETWORK").unwrap(), set);
        assert!(set.contains(SideEffect::Network) && !set.contains(SideEffect::FileWrite));
        assert!(!set.is_read_only());
        assert!(SideEffects::parse("READ_ONLY").unwrap().is_read_only());
    }

    #[test]
    fn read_only_stands_alone_and_unknown_names_are_refused() {
        let mixed = SideEffects::of(&[SideEffect::ReadOnly, SideEffect::Network]).unwrap_err();
        assert!(mixed.contains("READ_ONLY cannot be combined"), "{mixed}");
        let unknown = SideEffects::parse("NETWORK+EVERYTHING").unwrap_err();
        assert!(
            unknown.contains("unknown side-effect class `EVERYTHING`"),
            "{unknown}"
        );
        assert!(SideEffects::of(&[]).is_err());
    }

    #[test]
    fn a_proposal_may_write_one_class_or_an_array() {
        #[derive(Deserialize)]
        struct P {
            side_effect: SideEffects,
        }
        let one: P = toml::from_str("side_effect = \"FILE_WRITE\"").unwrap();
        assert_eq!(one.side_effect, SideEffect::FileWrite.into());
        let many: P = toml::from_str("side_effect = [\"SECRET_READ\", \"NETWORK\"]").unwrap();
        assert_eq!(many.side_effect.to_string(), "NETWORK+SECRET_READ");
        let bad = toml::from_str::<P>("side_effect = [\"READ_ONLY\", \"NETWORK\"]")
            .err()
            .unwrap();
        assert!(
            bad.to_string().contains("READ_ONLY cannot be combined"),
            "{bad}"
        );
    }
}
