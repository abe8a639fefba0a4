//! `imported`: the check that a skill's files are exactly those of a bundle another workspace
//! signed, by a key this workspace's trust policy accepts, before the import pipeline takes them
//! as built. It is what makes `pipelines/import.toml` a path for bundles only: run without one
//! (or with files of the workspace's own beside or instead of the bundle's), it fails.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use indexmap::IndexMap;

use super::allowlist::Allowlist;
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::skills::trust::TrustPolicy;

pub const KIND: NodeKind = NodeKind {
    name: "imported",
    parse,
    schema: <ImportedConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct ImportedConfig {
    /// The skill whose files are checked.
    #[schemars(with = "String")]
    skill: Spanned<String>,
    /// The SKILL_BUNDLE artifact `kavi skill import` kept (its SHA-256).
    #[schemars(with = "String")]
    bundle: Spanned<String>,
    #[schemars(with = "Option<String>")]
    trust: Option<Spanned<String>>,
    /// The allowlist the bundle's files must pass as a build's would (default
    /// `policies/allowlist.toml`): its `deny` globs and its paths.
    #[schemars(with = "Option<String>")]
    allowlist: Option<Spanned<String>>,
    /// Values for the allowlist's path templates, such as `skill`.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    vars: IndexMap<String, Spanned<String>>,
}

#[derive(Debug)]
struct Imported {
    skill: String,
    bundle: String,
    trust: TrustPolicy,
    allowlist: Allowlist,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: ImportedConfig = config.deserialize()?;
    for field in [&raw.skill, &raw.bundle] {
        config.check_template(field)?;
    }
    let trust = crate::skills::trust::load(config, raw.trust.as_ref())?;
    let allowlist = Allowlist::load(config, raw.allowlist.as_ref(), raw.vars)?;
    Ok(Arc::new(Imported {
        skill: raw.skill.into_inner(),
        bundle: raw.bundle.into_inner(),
        trust,
        allowlist,
    }))
}

impl Imported {
    fn check(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let skill = crate::skills::render_name(ctx, &self.skill)?;
        let sha = ctx.render("bundle", &self.bundle)?;
        if sha.len() != 64 || !sha.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(format!(
                "`{sha}` is not an artifact's SHA-256 (64 lowercase hex digits): import a bundle \
                 with `kavi skill import`"
            ));
        }
        let text = ctx
            .env
            .artifacts
            .read_text(&sha)
            .map_err(|e| format!("no bundle to import: {e}"))?;
        let bundle = kavi_provenance::Bundle::from_json(&text).map_err(|e| e.to_string())?;
        let statement = self
            .trust
            .check_bundle(&bundle)
            .map_err(|why| format!("the bundle is refused: {why}"))?;
        let signer = bundle.key.to_lowercase();
        if bundle.skill != skill {
            return Err(format!(
                "the bundle is of `{}`, not `{skill}`",
                bundle.skill
            ));
        }
        let ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let proposal = ledger
            .skill(&skill)
            .map_err(|e| e.to_string())?
            .proposal_path;
        // The skill's files pass the allowlist a build's would: nothing a build may not bring
        // in comes in by bundle.
        let allowed = self.allowlist.resolve(ctx)?;
        let refused: Vec<String> = bundle
            .files
            .iter()
            .filter(|(path, _)| *path != proposal)
            .filter_map(|(path, _)| self.allowlist.refusal(path, &allowed))
            .collect();
        if !refused.is_empty() {
            return Err(format!(
                "the bundle's files are refused: {}",
                refused.join("; ")
            ));
        }
        // What trust will hash is what the bundle holds, file for file: nothing of this
        // workspace's own beside or instead of it.
        let tree =
            self.trust
                .read_tree(&ctx.env.templates, &ctx.env.workspace, &skill, &proposal)?;
        let here = tree.subjects();
        let same = here.len() == bundle.files.len()
            && here
                .iter()
                .zip(&bundle.files)
                .all(|(file, (path, attested))| {
                    file.name == *path
                        && file.bytes == &attested[..]
                        && file.executable == kavi_provenance::attested_executable(&statement, path)
                });
        if !same {
            return Err(format!(
                "the files of `{skill}` here are not exactly the bundle's: import the bundle \
                 with `kavi skill import`, into a workspace where {} holds nothing else",
                tree.folder
            ));
        }
        // Kept as this node's artifact: recorded, journaled and verified with the ledger, it
        // is the exporter's provenance beside this workspace's.
        let kept = ctx
            .env
            .artifacts
            .put_bytes("SKILL_BUNDLE", text.as_bytes())
            .map_err(|e| format!("failed to keep the bundle: {e}"))?;
        let mut outcome = NodeOutcome::succeeded(json!({
            "skill": skill,
            "bundle": sha,
            "signer": signer,
            "source_hash": tree.hash(),
        }));
        outcome.artifacts.push(("bundle", kept));
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for Imported {
    fn describe(&self) -> String {
        format!(
            "check that the files of skill {} are exactly those of bundle {}",
            self.skill, self.bundle
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.check(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
