//! Deliberately broken builds, so that the nemesis (`scripts/nemesis --break ...`) can
//! show its checkers catch a broken rule, as the simulation's `--break` modes do.
//!
//! Only a build with the `broken` feature reads `ONCEKV_BREAK` (a comma-separated list of
//! [`Break`] names); in every other build [`is`] is the constant `false`, so the checks
//! placed on the hot paths cost nothing and the product cannot be broken by its
//! environment.

/// A rule a broken build gives up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Break {
    /// `dedup`: a duplicate of a tracked command is executed again (exactly-once rule 5).
    Dedup,
    /// `stale-read`: a linearizable read is served from this member's applied state
    /// without a read index.
    StaleRead,
    /// `lease-clock`: a leader's read lease never runs out once held in its term.
    LeaseClock,
}

impl Break {
    /// Every break, with the name `ONCEKV_BREAK` gives it.
    pub const ALL: [(&'static str, Break); 3] = [
        ("dedup", Break::Dedup),
        ("stale-read", Break::StaleRead),
        ("lease-clock", Break::LeaseClock),
    ];
}

/// The breaks `spec` names (`ONCEKV_BREAK`'s syntax), or the first unknown name.
pub fn parse(spec: &str) -> Result<Vec<Break>, String> {
    spec.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|name| {
            Break::ALL
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, b)| *b)
                .ok_or_else(|| format!("unknown break {name:?} in ONCEKV_BREAK"))
        })
        .collect()
}

/// The breaks this process runs with (none unless built with the `broken` feature).
#[cfg(feature = "broken")]
pub fn active() -> &'static [Break] {
    static ACTIVE: std::sync::OnceLock<Vec<Break>> = std::sync::OnceLock::new();
    ACTIVE.get_or_init(|| {
        // An unknown name is fatal: a bite test that silently ran unbroken would pass.
        let spec = std::env::var("ONCEKV_BREAK").unwrap_or_default();
        parse(&spec).unwrap_or_else(|e| panic!("{e}"))
    })
}

/// The breaks this process runs with: none, in a build without the `broken` feature.
#[cfg(not(feature = "broken"))]
pub const fn active() -> &'static [Break] {
    &[]
}

/// Whether this process runs with `b` broken.
#[inline]
pub fn is(b: Break) -> bool {
    active().contains(&b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_and_an_unknown_one_is_refused() {
        assert_eq!(
            parse("dedup, lease-clock"),
            Ok(vec![Break::Dedup, Break::LeaseClock])
        );
        assert_eq!(parse(""), Ok(vec![]));
        assert!(parse("dedup,fsync").is_err());
    }

    #[cfg(not(feature = "broken"))]
    #[test]
    fn a_build_without_the_feature_ignores_the_environment() {
        assert!(!is(Break::Dedup) && !is(Break::StaleRead) && !is(Break::LeaseClock));
    }
}
