//! `build`: one build attempt of a skill, by the external builder, inside a sandbox.
//!
//! The attempt gets its own `builds` row (attempt number, parent build). Its packet is rendered
//! for that build id from a template (default `templates/build_packet.md.j2`) and frozen as a
//! BUILD_PACKET artifact; the configured builder (`builder` in kavi.toml, run through `sh -c`)
//! runs in the sandbox with the packet on stdin; its output becomes the BUILD_LOG. The builder
//! is told the sandbox (`KAVI_SANDBOX`, its working folder), never the workspace, and runs
//! under the `builder` profile of `policies/confinement.toml`: by default it may write only its
//! sandbox and a private temporary folder, and use no network.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use super::allowlist::Allowlist;
use crate::confinement::policy::{self, ConfinementPolicy, RoleProfile};
use crate::diagnostic::Diagnostic;
use crate::ledger::Ledger;
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::process::{self, CommandSpec, Exit};
use crate::skills::Lifecycle;
use crate::state::NodeState;
use crate::template::describe_error;

pub const KIND: NodeKind = NodeKind {
    name: "build",
    parse,
    schema: <BuildConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

/// How much of the builder's output is kept in the BUILD_LOG (each stream).
const LOG_LIMIT: usize = 1024 * 1024;

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct BuildConfig {
    #[schemars(with = "String")]
    skill: Spanned<String>,
    /// The sandbox folder, usually `{{ nodes.sandbox.outputs.path }}`.
    #[schemars(with = "String")]
    sandbox: Spanned<String>,
    /// The packet template under `templates/`.
    #[serde(default = "default_template")]
    #[schemars(with = "String")]
    template: Spanned<String>,
    /// The allowlist whose paths the packet lists (default `policies/allowlist.toml`).
    #[schemars(with = "Option<String>")]
    allowlist: Option<Spanned<String>>,
    /// Values for the allowlist's templates, also visible to the packet as `vars`.
    #[serde(default)]
    #[schemars(with = "IndexMap<String, String>")]
    vars: IndexMap<String, Spanned<String>>,
    /// Extra environment for the builder (values are templates).
    #[serde(default)]
    #[schemars(
        with = "IndexMap<String, String>",
        extend("propertyNames" = { "pattern": "^[A-Za-z_][A-Za-z0-9_]*$" })
    )]
    env: IndexMap<Spanned<String>, Spanned<String>>,
    /// The lifecycle policy: only a skill in a buildable state is built.
    #[schemars(with = "Option<String>")]
    lifecycle: Option<Spanned<String>>,
    /// The confinement policy whose `builder` profile the builder runs under.
    #[schemars(with = "Option<String>")]
    confinement: Option<Spanned<String>>,
}

fn default_template() -> Spanned<String> {
    Spanned::new(0..0, "build_packet.md.j2".to_owned())
}

#[derive(Debug)]
struct Build {
    skill: String,
    sandbox: String,
    template: String,
    allowlist: Allowlist,
    env: IndexMap<String, String>,
    lifecycle: Lifecycle,
    confinement: RoleProfile,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: BuildConfig = config.deserialize()?;
    config.check_template(&raw.skill)?;
    config.check_template(&raw.sandbox)?;
    // What `Build::run` adds to the node's context for the packet.
    let packet_scope = config
        .scope()
        .with("build", None)
        .with("paths", Some(vec!["allowed", "required"]))
        .with("previous", None)
        .with("vars", None);
    config.check_template_file(&raw.template, &packet_scope)?;
    config.governing.mark_builder();
    let allowlist = Allowlist::load(config, raw.allowlist.as_ref(), raw.vars)?;
    config.check_env(&raw.env)?;
    let lifecycle_source =
        config.load_policy_source(raw.lifecycle.as_ref(), super::transition::DEFAULT_POLICY)?;
    let confinement_source =
        config.load_policy_source(raw.confinement.as_ref(), policy::DEFAULT_POLICY)?;
    let confinement = ConfinementPolicy::parse(&confinement_source, config.templates)?;
    let needed = confinement.builder.network();
    let confinement = config.load_process_hosts(confinement, needed)?.builder;
    Ok(Arc::new(Build {
        env: raw
            .env
            .into_iter()
            .map(|(k, v)| (k.into_inner(), v.into_inner()))
            .collect(),
        lifecycle: Lifecycle::parse(&lifecycle_source)?,
        confinement,
        skill: raw.skill.into_inner(),
        sandbox: raw.sandbox.into_inner(),
        template: raw.template.into_inner(),
        allowlist,
    }))
}

/// The previous attempt of this skill, with its classification and research note, for the
/// packet: iteration happens across attempts, so what went wrong last time is written into the
/// next attempt's packet. `null` for a first attempt.
fn previous_attempt(
    ctx: &NodeContext<'_>,
    ledger: &Ledger,
    skill: &str,
) -> Result<serde_json::Value, String> {
    let builds = ledger.builds(skill).map_err(|e| e.to_string())?;
    let Some(last) = builds.last() else {
        return Ok(serde_json::Value::Null);
    };
    let note = match &last.research_note {
        None => serde_json::Value::Null,
        Some(sha) => {
            let text = ctx
                .env
                .artifacts
                .read_text(sha)
                .map_err(|e| format!("the research note of build {}: {e}", last.id))?;
            serde_json::from_str(&text)
                .map_err(|e| format!("the research note of build {} is not JSON: {e}", last.id))?
        }
    };
    // The gateway's revised packet, if it gave one: the next packet quotes it.
    let advisory = match &last.advisory {
        None => None,
        Some(sha) => Some(
            ctx.env
                .artifacts
                .read_text(sha)
                .map_err(|e| format!("the advisory of build {}: {e}", last.id))?,
        ),
    };
    Ok(json!({
        "build_id": last.id,
        "attempt": last.attempt,
        "status": last.status,
        "failure_kind": last.failure_kind,
        "research_note": last.research_note.as_ref().map(|sha| format!("sha256:{sha}")),
        "note": note,
        "advisory": advisory,
    }))
}

/// The first link found on an allowlisted path under `root` (the path itself or a folder on the
/// way), if any. The sandbox copy does not follow links out of the tree, so a link there would
/// send the build's files somewhere the allowlist never named.
fn link_on_allowed_path(root: &Path, allowed: &[(String, bool)]) -> Option<String> {
    for (path, _) in allowed {
        let mut prefix = PathBuf::new();
        for part in path.split('/') {
            prefix.push(part);
            let is_link = root
                .join(&prefix)
                .symlink_metadata()
                .is_ok_and(|m| m.file_type().is_symlink());
            if is_link {
                return Some(format!(
                    "`{}` is a symlink, and the allowlisted path `{path}` may not pass through a \
                     link (rule `no_links_on_allowlisted_paths`)",
                    prefix.display()
                ));
            }
        }
    }
    None
}

impl Build {
    async fn build(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        // The builder's confined launch follows the checks below: its cgroup move waits less.
        crate::confinement::bounds::move_soon();
        let skill = crate::skills::render_name(ctx, &self.skill)?;
        let sandbox = PathBuf::from(ctx.render("sandbox", &self.sandbox)?);
        if !sandbox.is_dir() {
            return Err(format!("sandbox {} is not a folder", sandbox.display()));
        }
        let sandbox_path = sandbox.clone();
        let builder = ctx.render("config.builder", "{{ config.builder }}")?;
        let allowed = self.allowlist.resolve(ctx)?;
        for (root, place) in [
            (&*ctx.env.workspace, "the workspace"),
            (&sandbox, "the sandbox"),
        ] {
            if let Some(refusal) = link_on_allowed_path(root, &allowed) {
                return Err(format!("refusing to build: {refusal} in {place}"));
            }
        }
        // A private temporary folder beside the sandbox, gone when the builder is.
        let tmp = crate::sandbox::private_temp(&ctx.env.sandboxes, "kavi-tmp-")
            .and_then(|tmp| ctx.env.owner.track(tmp.path()).map(|()| tmp))
            .map_err(|e| format!("failed to create the builder's temporary folder: {e}"))?;
        // Refused here, before a build is recorded, when the kernel cannot confine as required.
        let confinement = self.confinement.confine(
            &ctx.env.templates,
            &minijinja::context! { sandbox => &sandbox, tmp => tmp.path() },
            &[],
            &ctx.env.state_paths,
        )?;
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        if let Some(refusal) = crate::skills::build_refusal(&ledger, &self.lifecycle, &skill)
            .map_err(|e| e.to_string())?
        {
            return Err(refusal);
        }
        let previous = previous_attempt(ctx, &ledger, &skill)?;
        let build = ledger
            .start_build(&skill, ctx.run_id, ctx.node_id)
            .map_err(|e| e.to_string())?;

        let paths = json!({
            "allowed": allowed.iter().map(|(p, _)| p).collect::<Vec<_>>(),
            "required": allowed.iter().filter(|(_, r)| *r).map(|(p, _)| p).collect::<Vec<_>>(),
        });
        let context = minijinja::context! {
            build => minijinja::Value::from_serialize(&build),
            paths => minijinja::Value::from_serialize(&paths),
            previous => minijinja::Value::from_serialize(&previous),
            vars => self.allowlist.vars_value(ctx)?,
            ..ctx.vars.clone()
        };
        let packet_text = ctx
            .env
            .templates
            .render_file(&self.template, &context)
            .map_err(|e| format!("failed to render {}: {}", self.template, describe_error(&e)))?;
        let packet = ctx
            .env
            .artifacts
            .put_bytes("BUILD_PACKET", packet_text.as_bytes())
            .map_err(|e| format!("failed to store the build packet: {e}"))?;

        let mut env = process::base_env();
        env.extend([
            ("KAVI_SKILL".to_owned(), skill.clone()),
            ("KAVI_BUILD_ID".to_owned(), build.id.to_string()),
            ("KAVI_ATTEMPT".to_owned(), build.attempt.to_string()),
            ("KAVI_RUN_ID".to_owned(), ctx.run_id.to_string()),
            // The sandbox, never the workspace: nothing in the builder's environment leads there.
            ("KAVI_SANDBOX".to_owned(), sandbox.display().to_string()),
            ("TMPDIR".to_owned(), tmp.path().display().to_string()),
        ]);
        for (key, value) in &self.env {
            env.push((key.clone(), ctx.render(&format!("env.{key}"), value)?));
        }
        let spec = CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), builder.clone()],
            env,
            cwd: sandbox,
            stdin: Some(packet_text.into_bytes()),
            confinement: Some(confinement.clone()),
        };
        let options = ctx.capture(LOG_LIMIT, None);
        let finished = process::run(&spec, &options, &ctx.cancel).await;
        let (exit, log_text) = match &finished {
            Ok(f) => (
                f.exit,
                format!(
                    "{}\n--- stderr ---\n{}",
                    String::from_utf8_lossy(&f.stdout.head),
                    String::from_utf8_lossy(&f.stderr.head)
                ),
            ),
            Err(e) => (Exit::Code(-1), format!("could not start the builder: {e}")),
        };
        let log = ctx
            .env
            .artifacts
            .put_bytes("BUILD_LOG", log_text.as_bytes())
            .map_err(|e| format!("failed to store the build log: {e}"))?;
        let exit_code = match exit {
            Exit::Code(code) => Some(code),
            _ => None,
        };
        let succeeded = exit == Exit::Code(0);
        ledger
            .finish_build(build.id, succeeded, exit_code, &packet, Some(&log))
            .map_err(|e| e.to_string())?;

        let mut outcome = NodeOutcome::succeeded(json!({
            "build_id": build.id,
            // Which sandbox holds this build's result: what a copy-back of it rests on.
            "sandbox": sandbox_path,
            "attempt": build.attempt,
            "parent_build": build.parent_build,
            "packet": packet.sha256,
            "packet_path": ctx.env.artifacts.path_of(&packet),
            "log": log.sha256,
            "exit_code": exit_code,
            "confinement": confinement
                .record_run(finished.as_ref().ok().and_then(|f| f.network.as_ref())),
        }));
        outcome.exit_code = exit_code;
        outcome.artifacts.push(("packet", packet));
        outcome.artifacts.push(("log", log));
        match exit {
            Exit::Code(0) => {}
            Exit::Cancelled => outcome.state = NodeState::Cancelled,
            Exit::Code(code) => {
                outcome.state = NodeState::Failed;
                outcome.error = Some(match finished {
                    Err(ref e) => format!("could not start the builder `{builder}`: {e}"),
                    Ok(_) => format!("the builder exited with code {code}"),
                });
            }
            Exit::Signal(signal) => {
                outcome.state = NodeState::Failed;
                outcome.error = Some(format!("the builder was killed by signal {signal}"));
            }
        }
        // Stopped by its confinement: a kind of its own, so that the classifier (and so the
        // escalation rules) see what happened rather than a crash.
        if let Ok(Some(violation)) = finished.as_ref().map(|f| f.violation.as_ref()) {
            let kind = violation.failure_kind();
            outcome.state = NodeState::Failed;
            outcome.outputs["failure_kind"] = json!(kind);
            outcome.error = Some(format!("the builder was {violation}"));
        }
        Ok(outcome)
    }
}

#[async_trait::async_trait]
impl NodeAction for Build {
    fn describe(&self) -> String {
        format!(
            "build {} in {} with the configured builder ({})",
            self.skill, self.sandbox, self.template
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.build(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}
