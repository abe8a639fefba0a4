//! The adopted rule set: the files that govern runs (pipelines, policies, templates, chains,
//! `kavi.toml`) read as one set, and the rules in `policies/trust.toml`'s `[adoption]` that
//! classify a change to it as weakening, strengthening or neutral.

use std::path::Path;

use std::sync::Arc;

use globset::Glob;
use serde::{Deserialize, Serialize};

use super::roles::{self, Requirement, Roles};
use crate::diagnostic::SourceFile;
use crate::hash::set_hash;

/// The folders whose files govern, and `kavi.toml`.
const FOLDERS: [&str; 4] = kavi_spec::node::GOVERNING_FOLDERS;
const CONFIG: &str = kavi_spec::config::CONFIG_FILE;
/// Whether `path` (relative to the workspace) is in one of the governing folders.
pub fn in_governing_folder(path: &str) -> bool {
    FOLDERS.iter().any(|folder| {
        path.strip_prefix(folder)
            .is_some_and(|rest| rest.starts_with('/'))
    })
}

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
    /// and `kavi.toml`, and the content of each toolchain environment `kavi.toml` names. A file
    /// that is not UTF-8 is an error naming it.
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
                let Ok(relative) = entry.path().strip_prefix(root) else {
                    continue;
                };
                // A link would govern with a file the set does not hold, changed at will.
                if entry.path_is_symlink() && entry.depth() > 0 {
                    return Err(format!(
                        "{} is a symlink: a governing file must be a file of the workspace itself",
                        relative.display()
                    ));
                }
                if entry.file_type().is_file() {
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
        files.extend(toolchain_members(root, &files));
        files.sort();
        let hashes: Vec<(String, String)> = files
            .iter()
            .map(|(path, text)| (path.clone(), crate::hash::spec_hash(text)))
            .collect();
        let hash = set_hash(hashes.iter().map(|(p, h)| (ROLE, p.as_str(), h.as_str())));
        Ok(Self { files, hash })
    }
}

/// How the rule set names the content of the environment `kavi.toml` names for a toolchain:
/// `toolchain:NAME`, which no workspace file can be called.
pub fn toolchain_member(name: &str) -> String {
    format!("{TOOLCHAIN_MEMBER}{name}")
}

const TOOLCHAIN_MEMBER: &str = "toolchain:";

/// The content of each environment `kavi.toml` (among `files`) names with `[toolchain.NAME]
/// path`, as a member of the set (see [`kavi_foundation::content`]): adopting the rules adopts
/// those bytes, not a path whose files can change with no rule changing. An environment that
/// cannot be read is a member saying so, which no gate accepts.
fn toolchain_members(root: &Path, files: &[(String, String)]) -> Vec<(String, String)> {
    let Some((_, config)) = files.iter().find(|(path, _)| path == CONFIG) else {
        return Vec::new();
    };
    // A kavi.toml that does not parse is reported by every command that loads it.
    let Ok(config) = config.parse::<toml::Table>() else {
        return Vec::new();
    };
    let Some(toolchains) = config.get("toolchain").and_then(toml::Value::as_table) else {
        return Vec::new();
    };
    toolchains
        .iter()
        .filter_map(|(name, declared)| {
            let path = declared.get("path")?.as_str()?;
            let text = kavi_foundation::content::manifest(&root.join(path))
                .unwrap_or_else(|reason| format!("unreadable: {reason}\n"));
            Some((toolchain_member(name), text))
        })
        .collect()
}

/// The adopted rule set a decision is taken under, with the texts the ledger kept of it: a
/// decision that records trust or an approval reads its roles and requirements here, never from
/// the files on disk.
#[derive(Debug)]
pub struct Governing {
    pub row: crate::ledger::RuleSetRow,
    /// (path, text) of each adopted file, in path order.
    pub files: Vec<(String, String)>,
}

impl Governing {
    /// Reads the adopted set and its texts from the ledger; `None` when none is adopted. A row
    /// the journal's keyed entries do not vouch for (edited with raw SQL) is refused.
    pub fn adopted(ledger: &crate::ledger::Ledger) -> Result<Option<Self>, String> {
        match ledger.adopted_rules().map_err(|e| e.to_string())? {
            Some(row) => {
                ledger
                    .check_rule_set_journaled(row.id)
                    .map_err(|e| e.to_string())?;
                Self::of(ledger, row).map(Some)
            }
            None => Ok(None),
        }
    }

    /// A recorded set with the texts the ledger kept of it.
    pub fn of(
        ledger: &crate::ledger::Ledger,
        row: crate::ledger::RuleSetRow,
    ) -> Result<Self, String> {
        let mut files = Vec::new();
        for (path, hash) in row.files.as_object().into_iter().flatten() {
            let hash = hash.as_str().unwrap_or_default();
            let (_, text) = ledger.spec_text(hash).map_err(|e| e.to_string())?;
            files.push((path.clone(), text));
        }
        files.sort();
        Ok(Self { row, files })
    }

    /// An adopted file's text, by path.
    pub fn text(&self, path: &str) -> Option<&str> {
        self.files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, text)| text.as_str())
    }

    /// An adopted file as a source to parse; an error when the set has no such file.
    pub fn source(&self, path: &str) -> Result<Arc<SourceFile>, String> {
        self.text(path)
            .map(|text| SourceFile::new(path, text))
            .ok_or_else(|| format!("the adopted rule set has no {path}"))
    }

    /// Whether a text the ledger kept (by its spec hash) is one of the adopted files.
    pub fn holds(&self, spec_hash: &str) -> bool {
        self.row
            .files
            .as_object()
            .is_some_and(|files| files.values().any(|h| h == spec_hash))
    }

    /// The adopted roles; `None` for a set made before roles existed, whose approvals hold
    /// none.
    pub fn roles(&self) -> Result<Option<Roles>, String> {
        match self.text(roles::DEFAULT_POLICY) {
            None => Ok(None),
            Some(text) => Roles::parse(&SourceFile::new(roles::DEFAULT_POLICY, text))
                .map(Some)
                .map_err(|e| e.to_string()),
        }
    }

    /// The roles the current process's account holds in the adopted set.
    pub fn held_by_current_process(&self) -> Result<Vec<String>, String> {
        Ok(self
            .roles()?
            .map(|roles| roles.held_by_current_process())
            .unwrap_or_default())
    }

    /// The adopted lifecycle.
    pub fn lifecycle(&self) -> Result<crate::skills::Lifecycle, String> {
        let source = self.source(crate::skills::LIFECYCLE_POLICY)?;
        crate::skills::Lifecycle::parse(&source).map_err(|e| e.to_string())
    }

    /// The adopted `[adoption]` rules; `None` when the adopted trust policy has none.
    pub fn adoption(&self) -> Result<Option<AdoptionPolicy>, String> {
        self.text(crate::skills::trust::DEFAULT_POLICY)
            .map(crate::skills::trust::adoption_in)
            .transpose()
            .map(Option::flatten)
    }

    /// Each difference from the adopted set to `now`, in words, with its class by the adopted
    /// `[adoption]` rules (every one weakening when there are none).
    pub fn changes_to(&self, now: &RuleSet) -> Result<Vec<(String, Class)>, String> {
        let policy = self.adoption()?;
        let mut classified = Vec::new();
        for (path, words) in changes(&self.files, &now.files) {
            for word in words {
                let change = worded(&path, &word);
                let class = match &policy {
                    Some(policy) => policy.classify(&change)?,
                    None => Class::Weakening,
                };
                classified.push((change, class));
            }
        }
        Ok(classified)
    }

    /// Each change from the adopted set to `now` the adopted `[adoption]` rules call
    /// weakening, in words; none when `now` is the adopted set.
    pub fn weakened_by(&self, now: &RuleSet) -> Result<Vec<String>, String> {
        if self.row.set_hash == now.hash {
            return Ok(Vec::new());
        }
        Ok(self
            .changes_to(now)?
            .into_iter()
            .filter(|(_, class)| *class == Class::Weakening)
            .map(|(change, _)| change)
            .collect())
    }
}

/// One change as the `[adoption]` rules read it: `PATH: what changed`. The path is the file's
/// to choose, so it must not forge the words after it.
fn worded(path: &str, change: &str) -> String {
    format!("{}: {change}", super::diff::unticked(path))
}

/// What changed in each file from `before` to `after` (both (path, text) in path order): the
/// words of `kavi policy diff` for a TOML file, else `file added`, `removed` or `changed`.
pub fn changes(
    before: &[(String, String)],
    after: &[(String, String)],
) -> Vec<(String, Vec<String>)> {
    let find = |files: &[(String, String)], path: &str| {
        files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(_, text)| text.clone())
    };
    let mut paths: Vec<&str> = before
        .iter()
        .chain(after)
        .map(|(p, _)| p.as_str())
        .collect();
    paths.sort_unstable();
    paths.dedup();
    paths
        .into_iter()
        .filter_map(|path| {
            let words = match (find(before, path), find(after, path)) {
                (Some(old), Some(new)) if old == new => return None,
                (Some(old), Some(new)) if path.starts_with(TOOLCHAIN_MEMBER) => {
                    kavi_foundation::content::differences(&old, &new, 5)
                }
                (Some(old), Some(new)) => Some(&new)
                    .filter(|_| path.ends_with(".toml"))
                    .and_then(|new| super::diff::describe(&old, new))
                    .filter(|words| !words.is_empty())
                    .unwrap_or_else(|| vec!["file changed".to_owned()]),
                (Some(_), None) => vec!["file removed".to_owned()],
                (None, _) => vec!["file added".to_owned()],
            };
            Some((path.to_owned(), words))
        })
        .collect()
}

/// The adopted rules a decision that withdraws trust (`kavi reject`, `kavi skill revoke`) is
/// taken under. It is not refused while the disk weakens them, since it grants nothing; it reads
/// what it needs (the lifecycle's `rejected` and `revoked` states) from the adopted copies.
pub fn for_withdrawal(ledger: &crate::ledger::Ledger) -> Result<Governing, String> {
    Governing::adopted(ledger)?.ok_or_else(|| {
        "no rule set is adopted in this ledger yet (the first `kavi pipeline run` adopts the one \
         it runs under)"
            .to_owned()
    })
}

/// The one check every decision that records trust or an approval makes (a promotion, `kavi
/// approve`, `kavi skill restore`): it is refused while the
/// governing files under `root` differ from the adopted set in a weakening way (by the adopted
/// `[adoption]` rules), naming the pending change of exactly these files or `kavi policy
/// propose`; otherwise it is taken under the adopted set returned, whatever the disk says of
/// roles and requirements.
pub fn for_decision(ledger: &crate::ledger::Ledger, root: &Path) -> Result<Governing, String> {
    let current = RuleSet::read(root)?;
    let Some(adopted) = Governing::adopted(ledger)? else {
        return Err(format!(
            "no rule set is adopted in this ledger yet (the first `kavi pipeline run` adopts \
             the one it runs under); the files now are {}",
            crate::hash::short_hash(&current.hash)
        ));
    };
    let weakening = adopted.weakened_by(&current)?;
    if weakening.is_empty() {
        return Ok(adopted);
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
        "the governing files are not the adopted rule set ({} is adopted, the files now are {}) \
         and weaken it ({}): {next}",
        crate::hash::short_hash(&adopted.row.set_hash),
        crate::hash::short_hash(&current.hash),
        weakening.join("; ")
    ))
}

/// The rule texts a command that runs skills outside a pipeline run reads its run-time rules
/// from (the confinement, trust and MCP policies): never a weakening nobody adopted.
#[derive(Debug)]
pub struct RunRules {
    /// (path, text) of each file that governs, in path order.
    pub files: Vec<(String, String)>,
    /// The set these files are: the adopted one, or the files on disk.
    pub set_hash: String,
    /// The adopted set's id; `None` before any set is adopted.
    pub adopted: Option<i64>,
    /// The changes on disk that weaken the adopted set, and so do not govern; when there are
    /// any, `files` are the adopted set's.
    pub ignored: Vec<String>,
}

impl RunRules {
    /// A governing file as a source to parse; `None` when the governing set has no such file.
    pub fn source(&self, path: &str) -> Option<Arc<SourceFile>> {
        self.files
            .iter()
            .find(|(p, _)| p == path)
            .map(|(p, text)| SourceFile::new(p.as_str(), text.as_str()))
    }

    /// Which rules these are, in words.
    pub fn describe(&self) -> String {
        let hash = crate::hash::short_hash(&self.set_hash);
        match self.adopted {
            None => format!("the files on disk ({hash}; no rule set is adopted yet)"),
            Some(id) if !self.ignored.is_empty() => format!("adopted rule set {id} ({hash})"),
            Some(id) => {
                format!("the files on disk ({hash}), which do not weaken adopted rule set {id}")
            }
        }
    }
}

/// The rules a skill runs under outside a pipeline run, read once so that what was checked is
/// what governs. Like a pipeline run, the files on disk govern while they do not weaken the
/// adopted set (a strengthening governs at once); while they weaken it (by the adopted
/// `[adoption]` rules), the adopted copies the ledger keeps govern instead, so an edit nobody
/// reviewed never grants a skill or a client more. Before any set is adopted (`ledger` is `None`
/// or has none), the files on disk, which the first pipeline run adopts.
pub fn for_run(ledger: Option<&crate::ledger::Ledger>, root: &Path) -> Result<RunRules, String> {
    let current = RuleSet::read(root)?;
    let adopted = match ledger {
        Some(ledger) => Governing::adopted(ledger)?,
        None => None,
    };
    let Some(adopted) = adopted else {
        return Ok(RunRules {
            files: current.files,
            set_hash: current.hash,
            adopted: None,
            ignored: Vec::new(),
        });
    };
    let ignored = adopted.weakened_by(&current)?;
    let (files, set_hash) = if ignored.is_empty() {
        (current.files, current.hash)
    } else {
        (adopted.files, adopted.row.set_hash)
    };
    Ok(RunRules {
        files,
        set_hash,
        adopted: Some(adopted.row.id),
        ignored,
    })
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
    /// What becomes of skills trusted under an older rule set when this one is adopted
    /// (default `keep`).
    #[serde(default)]
    pub on_change: OnChange,
}

/// What adopting a rule set does to the skills promoted under an older one.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, schemars::JsonSchema,
)]
#[serde(rename_all = "lowercase")]
pub enum OnChange {
    /// They stay trusted; `kavi skill show` says which set they were trusted under.
    #[default]
    Keep,
    /// They move to the lifecycle's `drifted` state (SUSPENDED) and do not run until the forge
    /// builds and gates them again under the adopted set; `kavi skill restore` does not put
    /// back trust earned under an older set.
    Reverify,
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
        let text = std::fs::read_to_string(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../../policies/trust.toml"
        ))
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

    /// A file whose name spells a strengthening change is still only a file added.
    #[test]
    fn a_file_name_does_not_forge_the_words_of_a_change() {
        let policy = shipped();
        for name in [
            "pipelines/x: gate `g` added.toml",
            "pipelines/x: gate `g` made required.toml",
            "chains/y: `network`: true -> false.toml",
        ] {
            assert_eq!(
                policy.classify(&worded(name, "file added")).unwrap(),
                Class::Weakening,
                "{name}"
            );
        }
    }

    /// Changes the shipped rules once called strengthening: a removal riding with an addition
    /// to a set they strengthen by adding to, and a key added inside a gate.
    #[test]
    fn a_removal_or_a_changed_gate_never_passes_for_strengthening() {
        let policy = shipped();
        let classes = |path: &str, old: &str, new: &str| -> Vec<Class> {
            crate::diff::describe(old, new)
                .unwrap()
                .iter()
                .map(|change| policy.classify(&format!("{path}: {change}")).unwrap())
                .collect()
        };
        let swapped = classes(
            "policies/escalation.toml",
            "security_kinds = [\"SECURITY_VIOLATION\", \"VERIFY_SECRET\"]\n",
            "security_kinds = [\"UNKNOWN\"]\n",
        );
        assert_eq!(overall(&swapped), Class::Weakening, "{swapped:?}");
        let denied = classes(
            "policies/allowlist.toml",
            "deny = [\"**/.git/**\"]\n",
            "deny = [\"**/nothing-here\"]\n",
        );
        assert_eq!(overall(&denied), Class::Weakening, "{denied:?}");
        let added = classes(
            "policies/allowlist.toml",
            "deny = [\"**/.git/**\"]\n",
            "deny = [\"**/.git/**\", \"**/.env\"]\n",
        );
        assert_eq!(added, [Class::Strengthening]);
        let gate = "[[gate]]\nid = \"tests\"\nkind = \"command\"\nrun = [\"pytest\"]\n";
        let slower = classes(
            "policies/gates.toml",
            gate,
            &format!("{gate}timeout = \"3650days\"\n"),
        );
        assert_eq!(slower, [Class::Weakening]);
        let more = classes(
            "policies/gates.toml",
            gate,
            &format!("{gate}\n[[gate]]\nid = \"types\"\nkind = \"command\"\nrun = [\"mypy\"]\n"),
        );
        assert_eq!(more, [Class::Strengthening]);
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
        std::os::unix::fs::symlink("/etc/hostname", dir.path().join("policies/link.toml")).unwrap();
        let error = RuleSet::read(dir.path()).unwrap_err();
        assert!(error.contains("policies/link.toml is a symlink"), "{error}");
        std::fs::remove_file(dir.path().join("policies/link.toml")).unwrap();
        std::fs::write(dir.path().join("policies/bad.toml"), [0xff]).unwrap();
        let error = RuleSet::read(dir.path()).unwrap_err();
        assert!(error.contains("policies/bad.toml is not UTF-8"), "{error}");
    }
}
