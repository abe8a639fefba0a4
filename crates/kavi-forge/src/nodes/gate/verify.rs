//! Running a gate set: its toolchains provisioned, its gates run side by side, and the
//! verification report recorded.

use std::path::Path;

use serde_json::json;

use super::{Check, DETAIL_IN_ERROR, Gate, Scope};
use crate::ledger::{GateResult, Ledger};
use crate::node::{NodeAction, NodeContext, NodeOutcome};
use crate::nodes::vars::Vars;
use crate::skills::snapshot::Snapshot;
use crate::skills::trust::SkillTree;
use crate::state::NodeState;
use crate::toolchains::Provisioned;

/// Each toolchain the gates name, ready or why not, by name.
pub(super) type Toolchains = std::collections::HashMap<String, Result<Provisioned, String>>;

impl Gate {
    /// The values the secret rules of this set's `secret_scan` gates find in their files' text,
    /// even when a gate could not run its tools. A file that cannot be read has been reported
    /// by its gate already.
    fn secrets_in(
        &self,
        ctx: &NodeContext<'_>,
        cwd: &Path,
        vars: &minijinja::Value,
    ) -> Vec<String> {
        let mut values = Vec::new();
        for gate in &self.gates {
            let Check::Secrets { scanner, files, .. } = &gate.check else {
                continue;
            };
            let files: Vec<String> = files
                .iter()
                .filter_map(|f| Vars::apply(ctx, f, vars).ok())
                .collect();
            let Ok((read, _)) = crate::policy::scanner::read_skill_files(cwd, &files) else {
                continue;
            };
            for file in &read {
                values.extend(scanner.scan_secrets(&file.name, &file.text).1);
            }
        }
        values
    }

    /// Makes ready, once each, the toolchains the gates name; an install is reported on stderr
    /// as it happens.
    async fn provision(&self, ctx: &NodeContext<'_>) -> Toolchains {
        let mut ready = Toolchains::new();
        for gate in &self.gates {
            let Some((toolchain, _)) = gate.check.tool() else {
                continue;
            };
            if ready.contains_key(&toolchain.name) {
                continue;
            }
            let provisioned = crate::toolchains::provision::ensure(
                toolchain,
                &ctx.env.toolchains,
                &ctx.capture(64 * 1024, None),
                &ctx.cancel,
                &|line| eprintln!("{line}"),
            )
            .await
            .map_err(|e| e.to_string());
            ready.insert(toolchain.name.clone(), provisioned);
        }
        ready
    }

    pub(super) async fn verify(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let vars = self.vars.render(ctx)?;
        let cwd = ctx.env.workspace.join(ctx.render("cwd", &self.cwd)?);
        if !cwd.is_dir() {
            return Err(format!(
                "working directory {} does not exist",
                cwd.display()
            ));
        }
        let skill = ctx.render_optional("skill", self.skill.as_ref())?;
        // The gates' paths follow `vars.skill`: gating another skill's files would record them
        // as this one's verification.
        if let (Some(skill), Ok(named)) = (&skill, vars.get_attr("skill"))
            && !named.is_undefined()
            && named.as_str() != Some(skill.as_str())
        {
            return Err(format!(
                "`vars.skill` ({named}) is not the skill this node verifies (`{skill}`): the \
                 gates would check other files than the ones recorded as verified"
            ));
        }
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let row = match &skill {
            Some(skill) => match ledger.skill(skill) {
                Ok(row) => Some(row),
                Err(crate::ledger::LedgerError::SkillNotFound(_)) => None,
                Err(e) => return Err(e.to_string()),
            },
            None => None,
        };
        // The hash covers the proposal too, so only a proposed skill has one.
        let hash = |root: &Path| match (&self.trust, &row) {
            (Some(trust), Some(row)) => trust
                .source_hash(&ctx.env.templates, root, &row.name, &row.proposal_path)
                .map(Some),
            _ => Ok(None),
        };
        // The hashed bytes, read once: the gates judge a snapshot of exactly them, so a file
        // swapped in the workspace while they run (and swapped back before the second hash) is
        // never what they read.
        let tree = match (&self.trust, &row) {
            (Some(trust), Some(row)) => {
                Some(trust.read_tree(&ctx.env.templates, &cwd, &row.name, &row.proposal_path)?)
            }
            _ => None,
        };
        let before = tree.as_ref().map(SkillTree::hash);
        let view = match (&tree, &before) {
            (Some(tree), Some(hash)) => {
                let beneath = cwd
                    .strip_prefix(&*ctx.env.workspace)
                    .unwrap_or(Path::new(""));
                let governed = recorded_rules(&mut ledger, ctx, beneath).await?;
                Some(Snapshot::make_view(
                    tree,
                    hash,
                    |dir| ctx.env.owner.track(dir),
                    &governed,
                )?)
            }
            _ => None,
        };
        let workspace_cwd = cwd;
        let cwd = view
            .as_ref()
            .map_or_else(|| workspace_cwd.clone(), |view| view.path().to_owned());
        // Invariants compare what the skill declares with what it was proposed as.
        let class = row.as_ref().map(|row| row.side_effect.clone());
        // Each gate that starts a process (a command, the analyser, detect-secrets) gets a
        // private temporary folder and a confinement of its own: the gates of a set run at
        // once, and one that could write into another's folder could plant what that one
        // loads (a module first on pytest's path) or rewrite what it reports. A set of
        // invariants alone needs neither.
        let mut confined = Vec::with_capacity(self.gates.len());
        for gate in &self.gates {
            if !gate.check.starts_process() {
                confined.push(None);
                continue;
            }
            let tmp = crate::sandbox::private_temp(&ctx.env.sandboxes, "kavi-tmp-gates-")
                .and_then(|tmp| ctx.env.owner.track(tmp.path()).map(|()| tmp))
                .map_err(|e| format!("failed to create a gate's temporary folder: {e}"))?;
            let confinement = self.confinement.confine(
                &ctx.env.templates,
                &minijinja::context! {
                    workspace => &*ctx.env.workspace,
                    tmp => tmp.path(),
                    snapshot => &cwd,
                },
                &[],
                &ctx.env.state_paths,
            )?;
            confined.push(Some((confinement, tmp)));
        }
        let mut toolchains = self.provision(ctx).await;
        let watched = held_to_records(&ledger, &mut toolchains);
        let secrets = std::sync::Mutex::new(Vec::new());
        // A secret the secret scan finds is printed by no gate: a test's traceback or a type
        // error may quote the line that holds it, or print the key the code builds. Found
        // before the gates start, so that what they print is hidden as it is printed.
        let mut found = self.secrets_in(ctx, &cwd, &vars);
        let live = crate::redact::Redactor::new(&found);
        let scope = Scope {
            cwd: &cwd,
            vars: &vars,
            class: class.as_deref(),
            confined: None,
            allowed: &self.allowed,
            skill: match (&row, &self.trust) {
                (Some(row), Some(trust)) => Some((&row.name, &row.proposal_path, trust)),
                _ => None,
            },
            secrets: &secrets,
            live: live.as_ref(),
        };
        let scopes: Vec<Scope> = confined
            .iter()
            .map(|confined| Scope {
                confined: confined.as_ref().map(|(c, tmp)| (c, tmp.path())),
                ..scope
            })
            .collect();
        let mut results = futures_util::future::join_all(
            self.gates
                .iter()
                .zip(&scopes)
                .map(|(gate, scope)| gate.run(ctx, scope, &toolchains)),
        )
        .await;
        void_what_was_not_read(&mut results);
        void_what_the_code_reported(&mut results);
        found.extend(
            secrets
                .into_inner()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        if let Some(redactor) = crate::redact::Redactor::new(&found).map(|r| r.line_wise()) {
            for result in &mut results {
                if let Some(detail) = &mut result.detail {
                    *detail = redactor.text(detail);
                }
            }
        }
        // What passed must be what is recorded: files that changed under the gates void the run.
        if hash(&workspace_cwd)? != before {
            return Err(
                "the skill's files changed while the gates ran; nothing is recorded as verified"
                    .into(),
            );
        }
        for (path, stamps) in &watched {
            if kavi_foundation::content::stamps(path)? != *stamps {
                return Err(format!(
                    "the toolchain environment {} changed while the gates ran; nothing is \
                     recorded as verified",
                    path.display()
                ));
            }
        }
        if let Some(view) = &view {
            view.check().map_err(|e| {
                format!("the gates' copy of the skill changed while they ran ({e}); nothing is recorded as verified")
            })?;
        }
        let blocking: Vec<&GateResult> = results
            .iter()
            .filter(|r| r.required && r.status != "passed")
            .collect();
        // The kind that names the attempt: by the declared precedence, then by gate order.
        let rank = |r: &GateResult| {
            r.failure_kind
                .as_ref()
                .and_then(|kind| self.precedence.iter().position(|p| p == kind))
                .unwrap_or(usize::MAX)
        };
        let deciding = blocking
            .iter()
            .enumerate()
            .min_by_key(|(order, r)| (rank(r), *order))
            .map(|(_, r)| r);

        let report = json!({
            "set": self.set_path,
            "skill": skill,
            "source_hash": before,
            "gates": results,
        });
        let report_text = serde_json::to_string_pretty(&report).expect("report serializes");
        let artifact = ctx
            .env
            .artifacts
            .put_bytes("VERIFICATION_REPORT", report_text.as_bytes())
            .map_err(|e| format!("failed to store the verification report: {e}"))?;
        ledger
            .record_verifications(
                ctx.run_id,
                ctx.node_id,
                skill.as_deref(),
                before.as_deref(),
                blocking.is_empty(),
                &results,
                &artifact,
            )
            .map_err(|e| format!("failed to record verifications: {e}"))?;

        let mut outcome = NodeOutcome::succeeded(json!({
            "passed": blocking.is_empty(),
            "gates": results,
            "failure_kind": deciding.and_then(|r| r.failure_kind.clone()),
            "source_hash": before,
            "report": artifact.sha256,
            // Every gate's confinement is the same but for its own temporary folder.
            "confinement": confined.iter().flatten().next().map(|(c, _)| c.record()),
        }));
        outcome.artifacts.push(("report", artifact));
        if !blocking.is_empty() {
            outcome.state = NodeState::Failed;
            // Name each gate that held the skill back, with the start of its detail, so the
            // reason is visible where the run is watched and not only in the ledger.
            let mut error = String::from("required gates did not pass:");
            for r in &blocking {
                error.push_str(&format!("\n  {} ({})", r.gate, r.status));
                for line in r
                    .detail
                    .as_deref()
                    .unwrap_or_default()
                    .lines()
                    .take(DETAIL_IN_ERROR)
                {
                    error.push_str(&format!("\n    {line}"));
                }
            }
            outcome.error = Some(error);
        }
        Ok(outcome)
    }
}

/// A gate that passed over files Python reads otherwise than every gate's tool does (a scan
/// found them: a coding declaration, a name folded to another) judged text that is not what
/// runs: hidden code may even have run inside it and forged its report. Its pass is void, so
/// no row says `passed` for code no gate has seen. A failure stands: it is a finding still.
fn void_what_was_not_read(results: &mut [GateResult]) {
    let Some((scan, files)) = results.iter().find_map(|r| {
        let files = r.evidence.as_ref()?.get(super::READ_OTHERWISE)?;
        Some((r.gate.clone(), files.to_string()))
    }) else {
        return;
    };
    let kind = results
        .iter()
        .find(|r| r.gate == scan)
        .and_then(|r| r.failure_kind.clone());
    for result in results.iter_mut().filter(|r| r.status == "passed") {
        result.status = "void".to_owned();
        result.failure_kind.clone_from(&kind);
        result.detail = Some(format!(
            "not kept: gate {scan} found files Python reads otherwise than the tools do ({files}), \
             so what this gate judged is not what runs"
        ));
    }
}

/// A gate whose verdict the code under review's own process reports (a test run's report,
/// written by pytest in the process that runs the tests and the skill) cannot be vouched for
/// when the policy scan failed: what it found (a test hook, a module reached by reflection, a
/// process, a file written) is what could have written that report, as the attack round's
/// `len.__self__` test did, forging three passes. Its pass is void; a failure stands.
fn void_what_the_code_reported(results: &mut [GateResult]) {
    let Some((scan, kind)) = results
        .iter()
        .find(|r| r.kind == "policy_scan" && r.status == "failed")
        .map(|r| (r.gate.clone(), r.failure_kind.clone()))
    else {
        return;
    };
    let reported_by_the_code = |r: &GateResult| {
        r.evidence
            .as_ref()
            .is_some_and(|evidence| evidence.get(super::TEST_REPORT).is_some())
    };
    for result in results
        .iter_mut()
        .filter(|r| r.status == "passed" && reported_by_the_code(r))
    {
        result.status = "void".to_owned();
        result.failure_kind.clone_from(&kind);
        result.detail = Some(format!(
            "not kept: this verdict is the tests' own report, and gate {scan} found what in the \
             code could have written it"
        ));
    }
}

/// The texts this node's run recorded as governing it, by path beneath `beneath` (the gates'
/// folder in the workspace): what the gates' tools read (`policies/ruff.toml`, say), whatever
/// the disk holds by the time they run. The run, its governing set with it, is recorded in one
/// transaction that may still be open when its first node starts.
async fn recorded_rules(
    // `&mut`: a shared reference to a connection is not `Send` across the wait.
    ledger: &mut Ledger,
    ctx: &NodeContext<'_>,
    beneath: &Path,
) -> Result<Vec<(String, String)>, String> {
    let deadline = std::time::Instant::now() + RUN_RECORDED_WITHIN;
    while ledger.run(ctx.run_id).is_err() {
        if std::time::Instant::now() > deadline || ctx.cancel.is_cancelled() {
            return Err(format!(
                "run {} is not recorded, so neither are the rules that govern its gates",
                ctx.run_id
            ));
        }
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let members = ledger.governing(ctx.run_id).map_err(|e| e.to_string())?;
    members
        .into_iter()
        .filter_map(|member| {
            // A member outside the workspace (a pipeline file run by its path) is not in the
            // gates' view of it.
            let path = Path::new(&member.path);
            let path = path
                .is_relative()
                .then_some(path)?
                .strip_prefix(beneath)
                .ok()?;
            Some((path.to_str()?.to_owned(), member.spec_hash))
        })
        .map(|(path, hash)| match ledger.spec_text(&hash) {
            Ok((_, text)) => Ok((path, text)),
            Err(e) => Err(format!("the recorded text of {path} cannot be read: {e}")),
        })
        .collect()
}

/// How long a gate waits for its run's record (see [`recorded_rules`]).
const RUN_RECORDED_WITHIN: std::time::Duration = std::time::Duration::from_secs(60);

#[async_trait::async_trait]
impl NodeAction for Gate {
    fn describe(&self) -> String {
        let ids: Vec<&str> = self.gates.iter().map(|g| g.id.as_str()).collect();
        format!("gate set {} ({})", self.set_path, ids.join(", "))
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.verify(ctx).await.unwrap_or_else(NodeOutcome::failed)
    }
}

/// Each environment among `toolchains` with the stamps it was checked at: a provisioned one was
/// held to kavi's record of installing it (see `kavi_toolchains::installed`); one kavi.toml
/// names is made an error here unless its content is the adopted one (see [`as_adopted`]).
fn held_to_records(
    ledger: &Ledger,
    toolchains: &mut Toolchains,
) -> Vec<(std::path::PathBuf, String)> {
    let mut watched = Vec::new();
    for (name, ready) in toolchains.iter_mut() {
        let Ok(provisioned) = ready else { continue };
        if provisioned.origin != "existing" {
            match &provisioned.stamps {
                Some(stamps) => watched.push((provisioned.path.clone(), stamps.clone())),
                None => *ready = Err(format!("toolchain `{name}` was not checked")),
            }
            continue;
        }
        match as_adopted(ledger, name, &provisioned.path) {
            Ok((content, stamps)) => {
                provisioned.content = Some(content);
                watched.push((provisioned.path.clone(), stamps));
            }
            Err(refused) => *ready = Err(refused),
        }
    }
    watched
}

/// The environment kavi.toml names for toolchain `name`, at `path`, held to the content the
/// adopted rule set keeps of it (see `kavi_policy::adoption::toolchain_member`): the tools a gate
/// runs are the bytes someone adopted, whatever the environment's own `RECORD` files say.
/// Returns the `sha256:` of its content and its stamps, which must not move while the gates
/// run. The stamps are taken first, so a change made while it is hashed is seen by one check or
/// the other.
fn as_adopted(ledger: &Ledger, name: &str, path: &Path) -> Result<(String, String), String> {
    use kavi_foundation::content;
    let refused = |why: String| {
        format!(
            "toolchain `{name}`: refusing the environment {} (from kavi.toml), its tools are not \
             run: {why}",
            path.display()
        )
    };
    let adopted = crate::policy::adoption::Governing::adopted(ledger)?
        .ok_or_else(|| refused("no rule set is adopted yet, so its content is not".into()))?;
    let member = crate::policy::adoption::toolchain_member(name);
    let Some(kept) = adopted.text(&member) else {
        return Err(refused(format!(
            "adopted rule set {} does not hold its content; propose the kavi.toml that names it \
             (`kavi policy propose`) and adopt it",
            adopted.row.id
        )));
    };
    let stamps = content::stamps(path).map_err(&refused)?;
    let now = content::manifest(path).map_err(&refused)?;
    if now != kept {
        return Err(refused(format!(
            "its files are not the ones adopted in rule set {}: {}\nhelp: if the change is \
             wanted, `kavi policy propose` records it for review",
            adopted.row.id,
            content::differences(kept, &now, 5).join(", ")
        )));
    }
    let content = kavi_foundation::hash::spec_hash(&now);
    Ok((content, stamps))
}
