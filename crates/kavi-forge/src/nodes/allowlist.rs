//! The diff allowlist, shared by `diff_gate` and `copy_back`: which paths a build may change,
//! rendered per run from the policy's templates and the node's `vars`, and the review of a
//! sandbox against kavi's manifest of it and the limits it was made under.

use std::collections::BTreeSet;
use std::path::Path;

use globset::GlobSet;
use indexmap::IndexMap;
use serde::Serialize;
use toml::Spanned;

use super::vars::Vars;
use crate::diagnostic::Diagnostic;
use crate::ledger::{Ledger, SandboxLimits};
use crate::node::{NodeConfig, NodeContext};
use crate::policy::AllowlistPolicy;
use crate::sandbox::{self, manifest};
use manifest::{Change, ChangeKind, Entry, EntryKind};

pub const DEFAULT_POLICY: &str = "policies/allowlist.toml";

#[derive(Debug)]
pub struct Allowlist {
    /// Path templates over `vars`, and whether each is required.
    paths: Vec<(String, bool)>,
    ignore: GlobSet,
    /// Paths never admitted, whatever `paths` says, with the globs as written.
    deny: (GlobSet, Vec<String>),
    /// The node's values for the templates; each is itself a template over the run.
    vars: Vars,
    pub policy_path: String,
}

/// How many paths of each list a node's outputs and messages show; the review artifact keeps all.
const SHOWN: usize = 50;

/// How the changes in a sandbox measure up against the allowlist and the sandbox's limits.
#[derive(Debug, Default, Serialize)]
pub struct Review {
    /// Every path that differs from the manifest kavi recorded, in order.
    pub changed: Vec<String>,
    pub allowed: Vec<String>,
    pub ignored: Vec<String>,
    /// Changed paths outside the allowlist.
    pub violations: Vec<String>,
    /// Allowed paths refused all the same, and limits exceeded: each names the path and rule.
    pub refused: Vec<String>,
    pub missing_required: Vec<String>,
    /// The sandbox policy whose limits applied.
    pub limits_policy: String,
}

/// `items` joined, at most [`SHOWN`] of them, saying how many more there are.
fn listed(items: &[String]) -> String {
    let shown = items
        .iter()
        .take(SHOWN)
        .cloned()
        .collect::<Vec<_>>()
        .join(", ");
    match items.len().saturating_sub(SHOWN) {
        0 => shown,
        more => format!("{shown} and {more} more"),
    }
}

impl Review {
    pub fn passed(&self) -> bool {
        self.violations.is_empty() && self.refused.is_empty() && self.missing_required.is_empty()
    }

    /// One line naming every offending path (up to [`SHOWN`] per list) and every rule broken.
    pub fn failure(&self) -> String {
        let mut parts = Vec::new();
        if !self.violations.is_empty() {
            parts.push(format!(
                "changed outside the allowlist: {}",
                listed(&self.violations)
            ));
        }
        parts.extend(self.refused.iter().cloned());
        if !self.missing_required.is_empty() {
            parts.push(format!(
                "required but missing: {}",
                self.missing_required.join(", ")
            ));
        }
        parts.join("; ")
    }

    /// The review for a node's outputs: long lists cut to [`SHOWN`] paths, with their counts.
    pub fn summary(&self) -> serde_json::Value {
        let cut = |items: &[String]| items.iter().take(SHOWN).cloned().collect::<Vec<_>>();
        serde_json::json!({
            "changed": cut(&self.changed),
            "changed_count": self.changed.len(),
            "allowed": self.allowed,
            "ignored": cut(&self.ignored),
            "ignored_count": self.ignored.len(),
            "violations": cut(&self.violations),
            "violation_count": self.violations.len(),
            "refused": self.refused,
            "missing_required": self.missing_required,
            "limits_policy": self.limits_policy,
        })
    }
}

/// The refusal of an allowed path that is not a regular file; `what` is its kind, "a FIFO".
pub fn not_a_regular_file(path: &str, what: &str) -> String {
    format!("`{path}` is {what}: only regular files are copied back (rule `regular_files_only`)")
}

/// The refusal of an allowed path with more than one link.
pub fn a_hard_link(path: &str, links: u64) -> String {
    format!(
        "`{path}` has {links} links (a hard link): only files with one link are copied back \
         (rule `single_link`)"
    )
}

/// Why an allowed path's new entry may not be copied back, naming the path and the rule.
fn entry_refusal(entry: &Entry, limits: &SandboxLimits, policy: &str) -> Option<String> {
    let path = &entry.path;
    if entry.kind != EntryKind::File {
        return Some(not_a_regular_file(path, entry.kind.describe()));
    }
    if entry.links > 1 {
        return Some(a_hard_link(path, entry.links));
    }
    if entry.size > limits.max_file_bytes {
        return Some(format!(
            "`{path}` holds {} bytes, over `max_file_bytes` = {} ({policy})",
            entry.size, limits.max_file_bytes
        ));
    }
    None
}

impl Allowlist {
    /// Loads the allowlist policy and checks that its templates read only the given `vars`.
    pub fn load(
        config: &mut NodeConfig<'_>,
        field: Option<&Spanned<String>>,
        vars: IndexMap<String, Spanned<String>>,
    ) -> Result<Self, Diagnostic> {
        let vars = Vars::load(config, vars)?;
        let policy = config.load_policy::<AllowlistPolicy>(field, DEFAULT_POLICY)?;
        for allowed in &policy.value.paths {
            vars.check_policy_template(config.templates, &allowed.path, &policy.source)?;
        }
        Ok(Self {
            paths: policy
                .value
                .paths
                .iter()
                .map(|p| (p.path.get_ref().clone(), p.required))
                .collect(),
            ignore: crate::diagnostic::glob_set(&policy.value.ignore, &policy.source)?,
            deny: (
                crate::diagnostic::glob_set(&policy.value.deny, &policy.source)?,
                policy
                    .value
                    .deny
                    .iter()
                    .map(|g| g.get_ref().clone())
                    .collect(),
            ),
            vars,
            policy_path: policy.source.path.display().to_string(),
        })
    }

    /// The node's vars, rendered for this run.
    pub fn vars_value(&self, ctx: &NodeContext<'_>) -> Result<minijinja::Value, String> {
        self.vars.render(ctx)
    }

    /// The allowed paths for this run, with whether each is required.
    pub fn resolve(&self, ctx: &NodeContext<'_>) -> Result<Vec<(String, bool)>, String> {
        let context = self.vars.render(ctx)?;
        let mut resolved = Vec::with_capacity(self.paths.len());
        for (template, required) in &self.paths {
            let path = Vars::apply(ctx, template, &context)?;
            // A value such as a skill named `../x` must not widen what may be written.
            if let Some(reason) = sandbox::unsafe_path_reason(&path) {
                return Err(format!("allowlist path `{path}` is refused: {reason}"));
            }
            resolved.push((path, *required));
        }
        Ok(resolved)
    }

    /// Why `path` is never admitted, if a `deny` glob says so.
    fn denied(&self, path: &str) -> Option<String> {
        let &glob = self.deny.0.matches(path).first()?;
        Some(format!(
            "`{path}` configures a gate's tool and is never admitted (`deny` glob `{}` in {})",
            self.deny.1[glob], self.policy_path
        ))
    }

    /// Why a file brought in whole, as an imported bundle's are, may not be: a `deny` glob
    /// names it, or it is none of the `allowed` paths (by-products the build may leave are
    /// not admitted either: a bundle has none).
    pub fn refusal(&self, path: &str, allowed: &[(String, bool)]) -> Option<String> {
        self.denied(path).or_else(|| {
            (!allowed.iter().any(|(a, _)| a == path))
                .then(|| format!("`{path}` is outside the allowlist ({})", self.policy_path))
        })
    }

    /// Compares the sandbox with the manifest kavi recorded when it made it, and sorts each
    /// change into allowed, ignored or violation; then applies the sandbox's limits, which it
    /// returns with the review.
    pub async fn review(
        &self,
        ctx: &NodeContext<'_>,
        sandbox_dir: &Path,
        allowed: &[(String, bool)],
    ) -> Result<(Review, SandboxLimits), String> {
        let ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let sandbox = ledger
            .sandbox_at(sandbox_dir)
            .map_err(|e| e.to_string())?
            .filter(|s| s.status != "removed")
            .ok_or_else(|| {
                format!(
                    "{} is not a sandbox kavi made: the ledger holds no manifest for it",
                    sandbox_dir.display()
                )
            })?;
        let baseline = ledger
            .sandbox_manifest(sandbox.id)
            .map_err(|e| e.to_string())?;
        drop(ledger);
        let root = sandbox_dir.to_owned();
        let (changes, baseline) = tokio::task::spawn_blocking(move || {
            manifest::changes(&root, &baseline).map(|changes| (changes, baseline))
        })
        .await
        .map_err(|e| format!("the review stopped: {e}"))?
        .map_err(|e| format!("failed to read the sandbox {}: {e}", sandbox_dir.display()))?;
        let review = self.judge(
            &changes,
            &baseline,
            allowed,
            &sandbox.limits,
            &sandbox.policy,
        );
        Ok((review, sandbox.limits))
    }

    fn judge(
        &self,
        changes: &[Change],
        baseline: &[Entry],
        allowed: &[(String, bool)],
        limits: &SandboxLimits,
        policy: &str,
    ) -> Review {
        // Folders that hold an allowed path may appear: making them is part of writing the file.
        let holders: BTreeSet<&str> = allowed
            .iter()
            .flat_map(|(path, _)| path.match_indices('/').map(move |(end, _)| &path[..end]))
            .collect();
        let mut review = Review {
            limits_policy: policy.to_owned(),
            ..Review::default()
        };
        let changed: BTreeSet<&str> = changes.iter().map(|c| c.path.as_str()).collect();
        let mut total_bytes = 0u64;
        for change in changes {
            let path = &change.path;
            let is_allowed = allowed.iter().any(|(a, _)| a == path);
            // A new folder is judged by what is in it; only an empty one is judged itself.
            let new_folder = change.change == ChangeKind::Added
                && change
                    .now
                    .as_ref()
                    .is_some_and(|e| e.kind == EntryKind::Dir);
            let inside = format!("{path}/");
            let has_changes_inside = changed
                .range(inside.as_str()..)
                .next()
                .is_some_and(|next| next.starts_with(&inside));
            if new_folder && (holders.contains(path.as_str()) || has_changes_inside) {
                continue;
            }
            review.changed.push(path.clone());
            if let Some(denied) = self.denied(path) {
                // Denied before anything else: not ignored, not allowed, never copied back.
                review.refused.push(denied);
            } else if self.ignore.is_match(path) {
                review.ignored.push(path.clone());
            } else if is_allowed {
                review.allowed.push(path.clone());
                if let Some(now) = &change.now {
                    total_bytes = total_bytes.saturating_add(now.size);
                    review.refused.extend(entry_refusal(now, limits, policy));
                }
            } else {
                review.violations.push(path.clone());
            }
        }
        let counted = (review.changed.len() - review.ignored.len()) as u64;
        if counted > limits.max_changed_files {
            review.refused.push(format!(
                "{counted} paths changed, over `max_changed_files` = {} ({policy})",
                limits.max_changed_files
            ));
        }
        if total_bytes > limits.max_total_bytes {
            review.refused.push(format!(
                "the allowed files hold {total_bytes} bytes together, over `max_total_bytes` = {} \
                 ({policy})",
                limits.max_total_bytes
            ));
        }
        for (path, required) in allowed {
            // A required path must be a regular file now: a link or a folder does not count.
            let present = match changes.iter().find(|c| &c.path == path) {
                Some(change) => change
                    .now
                    .as_ref()
                    .is_some_and(|e| e.kind == EntryKind::File),
                None => baseline
                    .iter()
                    .any(|e| &e.path == path && e.kind == EntryKind::File),
            };
            if *required && !present {
                review.missing_required.push(path.clone());
            }
        }
        review
    }
}
