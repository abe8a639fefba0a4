//! The adopted rule set: the files that govern runs (pipelines, policies, templates, chains,
//! `kavi.toml`) read as one set, and the rules in `policies/trust.toml`'s `[adoption]` that
//! classify a change to it as weakening, strengthening or neutral.

use std::path::Path;

use globset::Glob;
use serde::{Deserialize, Serialize};

use super::roles::Requirement;
use crate::spec::governing::set_hash;

/// The folders whose files govern, and `kavi.toml`.
const FOLDERS: [&str; 4] = ["pipelines", "policies", "templates", "chains"];
const CONFIG: &str = "kavi.toml";
/// The role each member has in the set hash.
pub const ROLE: &str = "rules";

/// The governing files of a workspace as they are on disk, in path order.
#[derive(Debug, Clone)]
pub struct RuleSet {
    /// (path relative to the workspace, text)
    pub files: Vec<(String, String)>,
    pub hash: String,
}

impl RuleSet {
    /// Reads every regular file of the governing folders (not hidden ones, nor Python's caches)
    /// and `kavi.toml`. A file that is not UTF-8 is an error naming it.
    pub fn read(root: &Path) -> Result<Self, String> {
        let mut paths = vec![CONFIG.to_owned()];
        for folder in FOLDERS {
            let walk = walkdir::WalkDir::new(root.join(folder))
                .into_iter()
                .filter_entry(|e| {
                    let name = e.file_name().to_string_lossy();
                    e.depth() == 0 || !(name.starts_with('.') || name == "__pycache__")
                });
            for entry in walk {
                let entry = match entry {
                    Ok(entry) => entry,
                    // A workspace without one of the folders governs without it.
                    Err(e)
                        if e.io_error()
                            .is_some_and(|io| io.kind() == std::io::ErrorKind::NotFound) =>
                    {
                        continue;
                    }
                    Err(e) => return Err(format!("cannot read the governing files: {e}")),
                };
                if entry.file_type().is_file()
                    && let Ok(relative) = entry.path().strip_prefix(root)
                {
                    paths.push(relative.to_string_lossy().into_owned());
                }
            }
        }
        paths.sort();
        let mut files = Vec::with_capacity(paths.len());
        for path in paths {
            let bytes = match std::fs::read(root.join(&path)) {
                Ok(bytes) => bytes,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && path == CONFIG => continue,
                Err(e) => return Err(format!("cannot read {path}: {e}")),
            };
            let text = String::from_utf8(bytes)
                .map_err(|_| format!("{path} is not UTF-8 text, which a governing file must be"))?;
            files.push((path, text));
        }
        let hashes: Vec<(String, String)> = files
            .iter()
            .map(|(path, text)| (path.clone(), crate::spec::spec_hash(text)))
            .collect();
        let hash = set_hash(hashes.iter().map(|(p, h)| (ROLE, p.as_str(), h.as_str())));
        Ok(Self { files, hash })
    }
}

/// Refuses when the governing files under `root` are not the adopted set: a run under them may
/// run, but not promote, approve or record trust. Names a pending change of exactly these files.
pub fn require_adopted(ledger: &crate::ledger::Ledger, root: &Path) -> Result<(), String> {
    let current = RuleSet::read(root)?;
    let adopted = ledger.adopted_rules().map_err(|e| e.to_string())?;
    let Some(adopted) = adopted else {
        return Err(format!(
            "no rule set is adopted in this ledger yet (the first `kavi pipeline run` adopts \
             the one it runs under); the files now are {}",
            crate::ledger::short_hash(&current.hash)
        ));
    };
    if adopted.set_hash == current.hash {
        return Ok(());
    }
    let pending = ledger
        .rule_sets()
        .map_err(|e| e.to_string())?
        .into_iter()
        .rfind(|s| s.status == "pending" && s.set_hash == current.hash);
    let next = match pending {
        Some(change) => format!(
            "rule change {} ({}) proposes them and is pending: approve it with `kavi policy \
             approve {id}` and adopt it with `kavi policy adopt {id}`",
            change.id,
            change.class,
            id = change.id
        ),
        None => "propose them with `kavi policy propose`".to_owned(),
    };
    Err(format!(
        "the governing files are not the adopted rule set ({} is adopted, the files now are {}): \
         {next}",
        crate::ledger::short_hash(&adopted.set_hash),
        crate::ledger::short_hash(&current.hash)
    ))
}

/// What kind of change a rule names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Class {
    Weakening,
    Strengthening,
    Neutral,
}

impl Class {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Weakening => "weakening",
            Self::Strengthening => "strengthening",
            Self::Neutral => "neutral",
        }
    }
}

/// `[adoption]` of `policies/trust.toml`: who must approve a weakening change, and how each
/// change is classified.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AdoptionPolicy {
    /// Approvals a change with any weakening part needs before `kavi policy adopt` (the
    /// proposer never counts). A change with none is adopted at once by its proposer.
    pub weakening: Requirement,
    /// The class of a change no rule matches (default weakening).
    #[serde(default = "weakening")]
    pub otherwise: Class,
    /// The first rule whose glob matches a change (`policies/gates.toml: gate `tests` removed`,
    /// as `kavi policy diff` words it, after the file's path) decides its class.
    #[serde(default, rename = "rule")]
    pub rules: Vec<ClassRule>,
}

fn weakening() -> Class {
    Class::Weakening
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ClassRule {
    /// A glob over `PATH: what changed` (`*` matches any text).
    pub matches: String,
    pub is: Class,
}

impl AdoptionPolicy {
    /// The class of one change; a glob that does not compile is an error naming it.
    pub fn classify(&self, change: &str) -> Result<Class, String> {
        for rule in &self.rules {
            let glob = Glob::new(&rule.matches)
                .map_err(|e| format!("invalid `matches` glob `{}`: {}", rule.matches, e.kind()))?
                .compile_matcher();
            if glob.is_match(change) {
                return Ok(rule.is);
            }
        }
        Ok(self.otherwise)
    }
}

/// The class of a whole change: weakening if any part is, else strengthening if any part is.
pub fn overall(classes: &[Class]) -> Class {
    if classes.contains(&Class::Weakening) {
        Class::Weakening
    } else if classes.contains(&Class::Strengthening) {
        Class::Strengthening
    } else {
        Class::Neutral
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> AdoptionPolicy {
        #[derive(Deserialize)]
        struct Trust {
            adoption: AdoptionPolicy,
        }
        let text =
            std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/policies/trust.toml"))
                .unwrap();
        let trust: toml::Table = toml::from_str(&text).unwrap();
        let adoption = toml::Table::from_iter([("adoption".to_owned(), trust["adoption"].clone())]);
        adoption.try_into::<Trust>().unwrap().adoption
    }

    #[test]
    fn the_shipped_rules_classify_the_usual_changes() {
        let policy = shipped();
        let class = |change: &str| policy.classify(change).unwrap();
        assert_eq!(
            class("policies/gates.toml: gate `tests` removed"),
            Class::Weakening
        );
        assert_eq!(
            class("policies/gates.toml: gate `lint` added: {}"),
            Class::Strengthening
        );
        assert_eq!(
            class("policies/gates.toml: gate `tests` made advisory"),
            Class::Weakening
        );
        assert_eq!(
            class("policies/gates.toml: gate `tests` made required"),
            Class::Strengthening
        );
        assert_eq!(
            class("kavi.toml: `builder`: \"a\" -> \"b\""),
            Class::Weakening
        );
        assert_eq!(
            overall(&[Class::Strengthening, Class::Neutral]),
            Class::Strengthening
        );
        assert_eq!(
            overall(&[Class::Strengthening, Class::Weakening]),
            Class::Weakening
        );
    }

    #[test]
    fn the_rule_set_is_every_governing_file_and_its_hash_follows_them() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("policies/__pycache__")).unwrap();
        std::fs::write(dir.path().join("policies/gates.toml"), "a = 1\n").unwrap();
        std::fs::write(dir.path().join("policies/__pycache__/x.pyc"), [0xff]).unwrap();
        std::fs::write(dir.path().join("kavi.toml"), "").unwrap();
        let set = RuleSet::read(dir.path()).unwrap();
        let paths: Vec<&str> = set.files.iter().map(|(p, _)| p.as_str()).collect();
        assert_eq!(paths, ["kavi.toml", "policies/gates.toml"]);
        std::fs::write(dir.path().join("policies/gates.toml"), "a = 2\n").unwrap();
        assert_ne!(RuleSet::read(dir.path()).unwrap().hash, set.hash);
        std::fs::write(dir.path().join("policies/bad.toml"), [0xff]).unwrap();
        let error = RuleSet::read(dir.path()).unwrap_err();
        assert!(error.contains("policies/bad.toml is not UTF-8"), "{error}");
    }
}
