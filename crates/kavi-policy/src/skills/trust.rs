//! Trust: the source hash of a skill, and the policy that says what it covers.
//!
//! Trust vouches for everything a skill runs: the proposal it was proposed from (its `command`,
//! class, secrets and schemas) and the files of its folder. The hash is SHA-256 over entries of
//! the form: a path, a NUL, the content's length as decimal, a NUL, and the content. The first
//! entry is the proposal file's text, with the empty path (which no file can have); then each
//! regular file under the skill's folder (not excluded, in byte order of the relative path).
//! Paths and lengths are part of it, so renaming or splitting a file changes it. A symlink
//! anywhere in the folder, or on the way to the proposal, is refused: its target is not the
//! skill's to vouch for.

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;

use globset::GlobSet;
use serde::Deserialize;
use toml::Spanned;

use super::conventions::Conventions;
pub use super::tree::{FileMeta, SkillTree, TreeFile};
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::template::{TemplateEngine, describe_error};

pub const DEFAULT_POLICY: &str = "policies/trust.toml";

/// Loads the trust policy a node's field names (default `policies/trust.toml`) with the naming
/// conventions it refers to; both files then govern the node.
pub fn load(
    config: &mut crate::node::NodeConfig<'_>,
    field: Option<&Spanned<String>>,
) -> Result<TrustPolicy, Diagnostic> {
    use super::conventions;
    let trust_source = config.load_policy_source(field, DEFAULT_POLICY)?;
    let conventions_source = config.load_policy_source(None, conventions::DEFAULT_POLICY)?;
    let conventions = Conventions::parse(&conventions_source, config.templates)?;
    TrustPolicy::parse(&trust_source, conventions)
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawTrust {
    folder: String,
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    exclude: Vec<Spanned<String>>,
    registry: String,
    /// Which path may promote; without it, nothing may.
    promotion: Option<RawPromotion>,
    /// How changes to the governing files are adopted; without it, whatever is on disk governs.
    adoption: Option<crate::adoption::AdoptionPolicy>,
    /// Whose skill bundles `kavi skill import` accepts; without it, nobody's.
    import: Option<RawImport>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawImport {
    /// The public keys (64 hex digits each, as `kavi ledger keygen` prints them) whose signed
    /// attestations this workspace accepts with a bundle. An accepted bundle is still verified
    /// by this workspace's gates and promoted only by a pipeline `[promotion]` names.
    #[schemars(with = "Vec<String>")]
    keys: Vec<Spanned<String>>,
    /// How old a bundle's attested promotion may be when it is imported (`"90 days"`, `"2w"`;
    /// humantime). A bundle outlives what its exporter may since have revoked: this bounds how
    /// long it is taken on its word. Without it, any age.
    #[schemars(with = "Option<String>")]
    max_age: Option<Spanned<String>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawPromotion {
    /// The pipelines (paths in the workspace) that may promote: the run that promotes and every
    /// run above it must be one of them.
    #[schemars(with = "Vec<String>")]
    pipelines: Vec<Spanned<String>>,
    /// The gate set (a path in the workspace) that must have passed the skill at the hash
    /// promoted, in the same run lineage.
    #[schemars(with = "String")]
    gates: Spanned<String>,
}

/// The governed path to TRUSTED: which pipelines may promote, after which gate set.
#[derive(Debug, Clone)]
pub struct PromotionRule {
    pub pipelines: Vec<String>,
    pub gates: String,
}

/// `policies/trust.toml`, parsed.
#[derive(Debug, Clone)]
pub struct TrustPolicy {
    /// A template over `skill` and `paths` (the naming conventions).
    pub folder: String,
    conventions: Conventions,
    pub exclude: GlobSet,
    /// Where the registry is written, relative to the workspace.
    pub registry: String,
    /// `None`: the policy names no path that may promote, so no promotion happens.
    pub promotion: Option<PromotionRule>,
    /// The public keys (hex) whose skill bundles may be imported.
    pub import_keys: Vec<String>,
    /// How old an imported bundle's attested promotion may be; `None`: any age.
    pub import_max_age: Option<std::time::Duration>,
    pub source: Arc<SourceFile>,
}

/// The `[adoption]` table of a trust policy's text (as the ledger kept it for the adopted set).
pub fn adoption_in(text: &str) -> Result<Option<crate::adoption::AdoptionPolicy>, String> {
    let raw: RawTrust = toml::from_str(text).map_err(|e| e.to_string())?;
    Ok(raw.adoption)
}

impl TrustPolicy {
    pub fn parse(source: &Arc<SourceFile>, conventions: Conventions) -> Result<Self, Diagnostic> {
        let raw: RawTrust =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let promotion = match raw.promotion {
            None => None,
            Some(rule) => {
                // Named as runs and verification reports name them: normalised, relative.
                let path = |spanned: &Spanned<String>| -> Result<String, Diagnostic> {
                    let text = spanned.get_ref();
                    let normal = Path::new(text)
                        .components()
                        .all(|c| matches!(c, std::path::Component::Normal(_)));
                    if !normal || text.ends_with('/') {
                        return Err(Diagnostic::new(format!(
                            "`{text}` must be a path in the workspace, relative and without `.` \
                             or `..` (such as `pipelines/forge.toml`)"
                        ))
                        .at(source, spanned.span()));
                    }
                    Ok(text.clone())
                };
                Some(PromotionRule {
                    pipelines: rule.pipelines.iter().map(path).collect::<Result<_, _>>()?,
                    gates: path(&rule.gates)?,
                })
            }
        };
        let import_keys = raw.import.as_ref().map_or(Ok(Vec::new()), |import| {
            import
                .keys
                .iter()
                .map(|key| {
                    crate::ledger::checkpoint::parse_public(key.get_ref())
                        .map(|_| key.get_ref().to_lowercase())
                        .ok_or_else(|| {
                            Diagnostic::new(format!(
                                "`{}` is not a public key: 64 hex digits, as `kavi ledger \
                                     keygen` prints them",
                                key.get_ref()
                            ))
                            .at(source, key.span())
                        })
                })
                .collect()
        })?;
        let import_max_age = match raw.import.as_ref().and_then(|i| i.max_age.as_ref()) {
            None => None,
            Some(age) => Some(humantime::parse_duration(age.get_ref()).map_err(|e| {
                Diagnostic::new(format!(
                    "invalid `max_age` `{}`: {e}; a duration such as \"90 days\"",
                    age.get_ref()
                ))
                .at(source, age.span())
            })?),
        };
        Ok(Self {
            folder: raw.folder,
            conventions,
            exclude: crate::diagnostic::glob_set(&raw.exclude, source)?,
            registry: raw.registry,
            promotion,
            import_keys,
            import_max_age,
            source: Arc::clone(source),
        })
    }

    /// The statement of `bundle` when this policy takes it in on its word: signed by a key
    /// `[import] keys` lists, its files exactly the attested ones, and its promotion no older
    /// than `[import] max_age`. What a workspace then does with the files (its own gates and
    /// promotion) is its pipelines'.
    pub fn check_bundle(
        &self,
        bundle: &kavi_provenance::Bundle,
    ) -> Result<serde_json::Value, String> {
        let signer = bundle.key.to_lowercase();
        if !self.import_keys.contains(&signer) {
            let named = if signer.bytes().all(|b| b.is_ascii_hexdigit()) {
                format!("key {}", crate::ledger::checkpoint::short(&signer))
            } else {
                "a key that is not hex".to_owned()
            };
            return Err(format!(
                "it is signed by {named}, which policies/trust.toml [import] keys does not list"
            ));
        }
        let key = crate::ledger::checkpoint::parse_public(&signer)
            .ok_or("its key is not a public key")?;
        let statement = bundle.check(&key).map_err(|e| e.to_string())?;
        if let Some(max_age) = self.import_max_age {
            older_than(&statement, max_age, jiff::Timestamp::now())?;
        }
        Ok(statement)
    }

    /// The skill's folder, relative to the tree it lives in.
    pub fn folder_of(&self, templates: &TemplateEngine, skill: &str) -> Result<String, String> {
        let paths = self.conventions.render(templates, skill)?;
        let context =
            minijinja::Value::from_serialize(serde_json::json!({ "skill": skill, "paths": paths }));
        templates.render_str(&self.folder, &context).map_err(|e| {
            format!(
                "failed to render the trust policy's folder: {}",
                describe_error(&e)
            )
        })
    }

    /// `sha256:<hex>` of the skill under `root`: its proposal file (`proposal`, relative to
    /// `root`) and its folder's files.
    pub fn source_hash(
        &self,
        templates: &TemplateEngine,
        root: &Path,
        skill: &str,
        proposal: &str,
    ) -> Result<String, String> {
        Ok(self.read_tree(templates, root, skill, proposal)?.hash())
    }

    /// Everything the source hash covers, read once: what promotion keeps and restore puts back.
    pub fn read_tree(
        &self,
        templates: &TemplateEngine,
        root: &Path,
        skill: &str,
        proposal: &str,
    ) -> Result<SkillTree, String> {
        let text = crate::sandbox::open_beneath(root, proposal)
            .and_then(|file| crate::sandbox::read_bounded(file, PROPOSAL_LIMIT))
            .map_err(|e| format!("cannot read the proposal {proposal}: {e}"))?;
        let folder = self.folder_of(templates, skill)?;
        let files = read_folder(&root.join(&folder), &self.exclude)
            .map_err(|e| format!("cannot hash {folder}: {e}"))?;
        Ok(SkillTree {
            proposal_path: proposal.to_owned(),
            proposal: text,
            folder,
            files,
        })
    }
}

/// How a skill's files differ from what was trusted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Drift {
    /// They cannot be read (or the kept tree cannot): the reason.
    Unreadable(String),
    /// They hash to this, not to the trusted hash.
    Hash(String),
    /// The bytes are the trusted ones, but a file's mode or modification time changed.
    Metadata(String),
}

impl TrustPolicy {
    /// The skill's files under `root`, read once and checked against what was trusted: the
    /// source hash, then, when the promotion kept its tree (`kept`: the store and the
    /// SKILL_TREE artifact) with their metadata, each file's mode and modification time.
    pub fn check_tree(
        &self,
        templates: &TemplateEngine,
        root: &Path,
        skill: &str,
        proposal: &str,
        trusted_hash: &str,
        kept: Option<(&crate::ledger::ArtifactStore, &str)>,
    ) -> Result<SkillTree, Drift> {
        let tree = self
            .read_tree(templates, root, skill, proposal)
            .map_err(Drift::Unreadable)?;
        let now = tree.hash();
        if now != trusted_hash {
            return Err(Drift::Hash(now));
        }
        if let Some((store, manifest)) = kept {
            let trusted = SkillTree::load(store, manifest, trusted_hash)
                .map_err(|e| Drift::Unreadable(format!("the tree kept at its promotion: {e}")))?;
            if let Some(reason) = tree.metadata_drift(&trusted) {
                return Err(Drift::Metadata(reason));
            }
        }
        Ok(tree)
    }
}

/// The most a proposal file may hold.
pub(super) const PROPOSAL_LIMIT: u64 = 1024 * 1024;

/// The source hash of a proposal's text and a folder; see the module documentation for the
/// exact definition.
#[cfg(test)]
fn source_hash(folder: &Path, exclude: &GlobSet, proposal: &[u8]) -> std::io::Result<String> {
    Ok(SkillTree {
        proposal_path: String::new(),
        proposal: proposal.to_vec(),
        folder: String::new(),
        files: read_folder(folder, exclude)?,
    }
    .hash())
}

/// The regular files under `folder` that are not excluded, in byte order of their relative
/// paths. A symlink anywhere is refused.
pub(super) fn read_folder(folder: &Path, exclude: &GlobSet) -> std::io::Result<Vec<TreeFile>> {
    if !folder.is_dir() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            "no such folder",
        ));
    }
    let mut files = Vec::new();
    for entry in walkdir::WalkDir::new(folder).follow_links(false) {
        let entry = entry.map_err(std::io::Error::other)?;
        let relative = entry
            .path()
            .strip_prefix(folder)
            .expect("walkdir yields paths under its root")
            .to_string_lossy()
            .into_owned();
        if entry.file_type().is_symlink() {
            return Err(std::io::Error::other(format!("`{relative}` is a symlink")));
        }
        if entry.file_type().is_file() && !exclude.is_match(&relative) {
            files.push((relative, entry.into_path()));
        }
    }
    files.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
    files
        .into_iter()
        .map(|(path, absolute)| {
            // Opened as what the walk saw, or refused: a FIFO put in a file's place since is
            // not waited on, and a file still growing is read as it was.
            let mut bytes = Vec::new();
            let mut file = crate::files::open_regular(&absolute)?;
            file.read_to_end(&mut bytes)?;
            let metadata = file.get_ref().metadata()?;
            Ok(TreeFile {
                path,
                bytes,
                executable: metadata.permissions().mode() & 0o111 != 0,
                meta: Some(FileMeta::of(&metadata)),
            })
        })
        .collect()
}

/// Refuses a bundle whose attested promotion was longer than `max_age` before `now`.
fn older_than(
    statement: &serde_json::Value,
    max_age: std::time::Duration,
    now: jiff::Timestamp,
) -> Result<(), String> {
    let at = kavi_provenance::attested_at(statement)
        .and_then(|at| at.parse::<jiff::Timestamp>().ok())
        .ok_or("its attestation says no time of promotion, and [import] max_age needs one")?;
    let allowed = jiff::SignedDuration::try_from(max_age).unwrap_or(jiff::SignedDuration::MAX);
    if now.duration_since(at) > allowed {
        return Err(format!(
            "its promotion was attested at {at}, longer ago than policies/trust.toml [import] \
             max_age ({}) allows; ask its workspace for a new export",
            humantime::format_duration(max_age)
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A bundle is as old as its attested promotion: within `max_age` it is taken, beyond it
    /// (or with no time said) it is refused.
    #[test]
    fn a_bundle_older_than_max_age_is_refused() {
        let statement = serde_json::json!({
            "predicate": { "runDetails": { "metadata": { "finishedOn": "2026-01-01T00:00:00Z" } } }
        });
        let day = std::time::Duration::from_secs(86_400);
        let now = |at: &str| at.parse::<jiff::Timestamp>().unwrap();
        assert!(older_than(&statement, 30 * day, now("2026-01-20T00:00:00Z")).is_ok());
        let refused = older_than(&statement, 30 * day, now("2026-03-01T00:00:00Z")).unwrap_err();
        assert!(refused.contains("longer ago than"), "{refused}");
        assert!(older_than(&serde_json::json!({}), day, now("2026-01-02T00:00:00Z")).is_err());
    }

    fn exclude() -> GlobSet {
        let mut builder = globset::GlobSetBuilder::new();
        builder.add(globset::Glob::new("**/__pycache__/**").unwrap());
        builder.build().unwrap()
    }

    #[test]
    fn the_hash_covers_the_proposal_names_and_contents_but_not_excluded_files() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::write(root.join("skill.py"), "a").unwrap();
        std::fs::write(root.join("test_skill.py"), "b").unwrap();
        let first = source_hash(root, &exclude(), b"proposal").unwrap();
        assert_eq!(first, source_hash(root, &exclude(), b"proposal").unwrap());

        std::fs::create_dir(root.join("__pycache__")).unwrap();
        std::fs::write(root.join("__pycache__/skill.pyc"), "x").unwrap();
        assert_eq!(
            first,
            source_hash(root, &exclude(), b"proposal").unwrap(),
            "by-products changed the hash"
        );

        std::fs::write(root.join("skill.py"), "A").unwrap();
        let edited = source_hash(root, &exclude(), b"proposal").unwrap();
        assert_ne!(first, edited, "one byte changed and the hash did not");

        assert_ne!(
            edited,
            source_hash(root, &exclude(), b"proposal, edited").unwrap(),
            "an edited proposal kept the hash"
        );

        std::fs::rename(root.join("skill.py"), root.join("skill2.py")).unwrap();
        assert_ne!(
            edited,
            source_hash(root, &exclude(), b"proposal").unwrap(),
            "a rename kept the hash"
        );
    }

    #[test]
    fn symlinks_and_missing_folders_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        assert!(source_hash(&dir.path().join("nope"), &exclude(), b"").is_err());
        std::os::unix::fs::symlink("/etc/passwd", dir.path().join("skill.py")).unwrap();
        let err = source_hash(dir.path(), &exclude(), b"").unwrap_err();
        assert!(err.to_string().contains("symlink"), "{err}");
    }
}
