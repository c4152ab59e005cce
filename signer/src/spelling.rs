//! How the command line spells the values of a fixed set (key types, CA algorithms, modes):
//! one canonical name each, the aliases also accepted, and a line of help. One table per enum
//! feeds its `FromStr`, its `Display` and the CLI's possible values (`--help`, shell
//! completions, man pages), so a spelling is accepted exactly where it is documented. Names
//! and aliases match without regard to ASCII case.

/// One value's spellings.
#[derive(Debug, Clone, Copy)]
pub struct Spelling<T: 'static> {
    pub value: T,
    /// The canonical name: what podca prints and documents first.
    pub name: &'static str,
    /// Other spellings accepted for it, documented in [`Spelling::help_line`].
    pub aliases: &'static [&'static str],
    pub help: &'static str,
}

impl<T> Spelling<T> {
    /// The help, then the aliases: `ECDSA P-256 with SHA-256; also p256, p-256`.
    pub fn help_line(&self) -> String {
        match self.aliases {
            [] => self.help.to_owned(),
            aliases => format!("{}; also {}", self.help, aliases.join(", ")),
        }
    }

    fn matches(&self, given: &str) -> bool {
        std::iter::once(&self.name)
            .chain(self.aliases)
            .any(|s| s.eq_ignore_ascii_case(given))
    }
}

/// A type whose values the command line names through a [`Spelling`] table.
pub trait Spelled: Copy + PartialEq + 'static {
    /// What a value is, for errors: `CA key algorithm`.
    const WHAT: &'static str;
    /// Every value, canonical name first, in the order help lists them.
    const SPELLINGS: &'static [Spelling<Self>];

    /// The value `given` names (canonical name or alias, any ASCII case).
    fn from_name(given: &str) -> Result<Self, UnknownName> {
        Self::SPELLINGS
            .iter()
            .find(|s| s.matches(given))
            .map(|s| s.value)
            .ok_or_else(|| UnknownName {
                what: Self::WHAT,
                given: given.to_owned(),
                expected: Self::SPELLINGS.iter().map(|s| s.name).collect(),
            })
    }

    /// The canonical name of `self`.
    fn canonical_name(self) -> &'static str {
        Self::SPELLINGS
            .iter()
            .find(|s| s.value == self)
            .map_or("?", |s| s.name)
    }
}

/// A name that is none of a table's spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown {what} {given:?}; expected one of {}", .expected.join(", "))]
pub struct UnknownName {
    pub what: &'static str,
    pub given: String,
    /// The canonical names.
    pub expected: Vec<&'static str>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CaAlgorithm, KeyType, RecordOutcome};
    use std::fmt;

    /// Every value of `all` has exactly one row, and no spelling names two values.
    fn assert_table<T: Spelled + fmt::Debug>(all: &[T]) {
        for value in all {
            let rows = T::SPELLINGS.iter().filter(|s| s.value == *value).count();
            assert_eq!(
                rows,
                1,
                "{value:?} has {rows} rows in the {} table",
                T::WHAT
            );
        }
        assert_eq!(T::SPELLINGS.len(), all.len(), "{}: a row too many", T::WHAT);
        let mut seen = std::collections::BTreeSet::new();
        for s in T::SPELLINGS {
            for name in std::iter::once(&s.name).chain(s.aliases) {
                assert!(
                    seen.insert(name.to_ascii_lowercase()),
                    "{}: {name} spelled twice",
                    T::WHAT
                );
                assert_eq!(T::from_name(name), Ok(s.value), "{name}");
            }
        }
    }

    #[test]
    fn every_table_names_each_value_once() {
        assert_table(&CaAlgorithm::ALL);
        assert_table(&KeyType::EVERY);
        assert_table(&[
            RecordOutcome::Issued,
            RecordOutcome::Denied,
            RecordOutcome::Failed,
        ]);
    }

    #[test]
    fn names_and_aliases_match_in_any_case_and_nothing_else() {
        assert_eq!(CaAlgorithm::from_name("P256"), Ok(CaAlgorithm::EcdsaP256));
        assert_eq!(CaAlgorithm::from_name("RSA"), Ok(CaAlgorithm::RsaSha256));
        assert_eq!(KeyType::from_name("ecdsap384"), Ok(KeyType::EcdsaP384));
        let e = CaAlgorithm::from_name("ecdsa_p256").expect_err("underscores are no alias");
        assert_eq!(
            e.to_string(),
            "unknown CA key algorithm \"ecdsa_p256\"; expected one of ecdsa-p256, ecdsa-p384, \
             ed25519, rsa-sha256, ml-dsa-44, ml-dsa-65, ml-dsa-87"
        );
    }

    #[test]
    fn the_help_line_names_the_aliases() {
        let p256 = &CaAlgorithm::SPELLINGS[0];
        assert_eq!(p256.name, "ecdsa-p256");
        assert!(p256.help_line().ends_with("; also p256, p-256, ecdsap256"));
        let ed = CaAlgorithm::SPELLINGS
            .iter()
            .find(|s| s.value == CaAlgorithm::Ed25519)
            .map(Spelling::help_line);
        assert_eq!(ed.as_deref(), Some("Ed25519"), "no aliases, no `also`");
    }

    #[test]
    fn display_is_the_canonical_name() {
        for alg in CaAlgorithm::ALL {
            assert_eq!(alg.to_string(), alg.canonical_name());
        }
        for kt in KeyType::EVERY {
            assert_eq!(kt.to_string(), kt.canonical_name());
        }
    }
}
