//! `escalate`: decide, by rules in a policy (default `policies/escalation.toml`), whether a
//! failed attempt goes to a person. When any rule fires, an escalation is recorded, the node
//! ends `awaiting_review`, and so does the run; the skill is not built again until someone
//! records a decision with `kavi approve RUN` or `kavi reject RUN`.

use std::sync::Arc;

use serde::Deserialize;
use serde_json::json;
use toml::Spanned;

use crate::diagnostic::{Diagnostic, SourceFile};
use crate::ledger::{BuildRow, Ledger};
use crate::node::{NodeAction, NodeConfig, NodeContext, NodeKind, NodeOutcome};
use crate::policy::classifier::Classifier;
use crate::policy::roles::{Requirement, Roles};
use crate::research::advisory;

pub const KIND: NodeKind = NodeKind {
    name: "escalate",
    parse,
    schema: <EscalateConfig as schemars::JsonSchema>::json_schema,
    calls_http: false,
};

pub const DEFAULT_POLICY: &str = "policies/escalation.toml";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct EscalateConfig {
    #[schemars(with = "String")]
    skill: Spanned<String>,
    /// The failure kind of this attempt, usually `{{ nodes.classify.outputs.kind }}`.
    #[schemars(with = "String")]
    failure_kind: Spanned<String>,
    #[schemars(with = "Option<String>")]
    rules: Option<Spanned<String>>,
    /// The classifier declaring the failure kinds the rules may name (default
    /// `policies/classifier.toml`).
    #[schemars(with = "Option<String>")]
    classifier: Option<Spanned<String>>,
}

/// `policies/escalation.toml`.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// REPEATED_FAILURE: this many consecutive failed attempts (at least 1).
    #[schemars(with = "u32")]
    repeated_failure: Spanned<u32>,
    /// SECURITY_CLASS: failure kinds that go to a person at once.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    security_kinds: Vec<Spanned<String>>,
    /// AMBIGUOUS: failure kinds the classifier could not name.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    ambiguous_kinds: Vec<Spanned<String>>,
    /// AMBIGUOUS, too: the attempt asked the gateway for an advisory and got none.
    #[serde(default)]
    advisory_unavailable_is_ambiguous: bool,
    /// PERMISSION_WIDENING: words a revised packet may not add (network, money, ...).
    #[serde(default)]
    permission_keywords: Vec<String>,
    /// LARGE_DIFF: the largest share of the packet's lines an advisory may rewrite (0.5 = 50 %),
    /// above 0 and at most 1.
    #[schemars(with = "Option<f64>")]
    large_diff: Option<Spanned<f64>>,
    /// Whether the account that started a run may approve it (`kavi approve`), when `approval`
    /// is absent (default true). With `approval`, the starter never counts.
    self_approval: Option<bool>,
    /// The approvals a decision needs: distinct accounts holding a role of
    /// `policies/roles.toml`, never the run's starter. Absent: one approval by anyone (subject
    /// to `self_approval`).
    #[schemars(with = "Option<Requirement>")]
    approval: Option<Spanned<Requirement>>,
}

/// Who may approve a run the rules stopped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApprovalRule {
    /// One approval by any account; by the starter too when `self_approval` says so.
    Anyone { self_approval: bool },
    /// Distinct role holders other than the starter, as many as the requirement names.
    Requires(Requirement),
}

/// What escalation rules (their text, as the ledger kept it) ask of an approval.
pub fn approval_rule(rules: &crate::diagnostic::SourceFile) -> Result<ApprovalRule, String> {
    let rules: Rules = toml::from_str(&rules.text).map_err(|e| e.to_string())?;
    Ok(match rules.approval {
        Some(requirement) => ApprovalRule::Requires(requirement.into_inner()),
        None => ApprovalRule::Anyone {
            self_approval: rules.self_approval.unwrap_or(true),
        },
    })
}

impl Rules {
    /// Values in range, and only failure kinds the classifier declares.
    fn check(&self, source: &Arc<SourceFile>, classifier: &Classifier) -> Result<(), Diagnostic> {
        if *self.repeated_failure.get_ref() == 0 {
            return Err(Diagnostic::new(
                "`repeated_failure` counts failed attempts and must be at least 1",
            )
            .at(source, self.repeated_failure.span()));
        }
        if let Some(limit) = &self.large_diff
            && !(*limit.get_ref() > 0.0 && *limit.get_ref() <= 1.0)
        {
            return Err(Diagnostic::new(
                "`large_diff` is a share of the packet's lines: above 0 and at most 1 (0.5 = 50 %)",
            )
            .at(source, limit.span()));
        }
        for kind in self.security_kinds.iter().chain(&self.ambiguous_kinds) {
            classifier.check_kind(kind, source)?;
        }
        Ok(())
    }

    /// A requirement names a declared role, and does not contradict `self_approval = true`.
    fn check_approval(
        &self,
        source: &Arc<SourceFile>,
        roles: impl FnOnce() -> Result<Roles, Diagnostic>,
    ) -> Result<(), Diagnostic> {
        let Some(approval) = &self.approval else {
            return Ok(());
        };
        if self.self_approval == Some(true) {
            return Err(Diagnostic::new(
                "`approval` never counts the account that started the run, so \
                 `self_approval = true` contradicts it: remove `self_approval`",
            )
            .at(source, approval.span()));
        }
        roles()?.check(approval.get_ref(), source, approval.span())
    }

    fn names(kinds: &[Spanned<String>], kind: &str) -> bool {
        kinds.iter().any(|k| k.get_ref() == kind)
    }
}

#[derive(Debug)]
struct Escalate {
    skill: String,
    failure_kind: String,
    rules: Rules,
    /// The rules' spec hash, recorded with each escalation they raise.
    rules_hash: String,
}

fn parse(config: &mut NodeConfig<'_>) -> Result<Arc<dyn NodeAction>, Diagnostic> {
    let raw: EscalateConfig = config.deserialize()?;
    config.check_template(&raw.skill)?;
    config.check_template(&raw.failure_kind)?;
    let source = config.load_policy_source(raw.rules.as_ref(), DEFAULT_POLICY)?;
    let rules: Rules =
        toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(&source, &e))?;
    rules.check(
        &source,
        &crate::policy::classifier::load(config, raw.classifier.as_ref())?,
    )?;
    rules.check_approval(&source, || {
        Roles::parse(&config.load_policy_source(None, crate::policy::roles::DEFAULT_POLICY)?)
    })?;
    Ok(Arc::new(Escalate {
        skill: raw.skill.into_inner(),
        failure_kind: raw.failure_kind.into_inner(),
        rules,
        rules_hash: source.spec_hash().to_owned(),
    }))
}

impl Escalate {
    /// What the attempt's advisory, if it asked for one, says about escalating.
    fn advisory_triggers(
        &self,
        ctx: &NodeContext<'_>,
        build: &BuildRow,
    ) -> Result<Vec<serde_json::Value>, String> {
        let mut triggers = Vec::new();
        if let Some(error) = &build.advisory_error
            && self.rules.advisory_unavailable_is_ambiguous
        {
            triggers
                .push(json!({ "trigger": "AMBIGUOUS", "reason": format!("no advisory: {error}") }));
        }
        let (Some(packet), Some(advisory)) = (&build.packet, &build.advisory) else {
            return Ok(triggers);
        };
        let read = |sha: &str| ctx.env.artifacts.read_text(sha);
        let (packet, revised) = (read(packet)?, read(advisory)?);
        let added = advisory::widening(&packet, &revised, &self.rules.permission_keywords);
        if !added.is_empty() {
            triggers.push(json!({
                "trigger": "PERMISSION_WIDENING",
                "reason": format!("the advisory adds {}", added.join(", ")),
            }));
        }
        if let Some(limit) = self.rules.large_diff.as_ref().map(|l| *l.get_ref()) {
            let share = advisory::changed_share(&packet, &revised);
            if share > limit {
                triggers.push(json!({
                    "trigger": "LARGE_DIFF",
                    "reason": format!(
                        "the advisory rewrites {:.0} % of the packet's lines (limit {:.0} %)",
                        share * 100.0,
                        limit * 100.0
                    ),
                }));
            }
        }
        Ok(triggers)
    }

    fn evaluate(&self, ctx: &NodeContext<'_>) -> Result<NodeOutcome, String> {
        let skill = crate::skills::render_name(ctx, &self.skill)?;
        let kind = ctx.render("failure_kind", &self.failure_kind)?;
        let mut ledger = Ledger::open(&ctx.env.ledger).map_err(|e| e.to_string())?;
        let builds = ledger.builds(&skill).map_err(|e| e.to_string())?;
        let consecutive = builds
            .iter()
            .rev()
            .take_while(|b| b.failure_kind.is_some())
            .count();

        // Only a new failed attempt counts: a run whose build was refused (awaiting review,
        // rejected, not buildable) adds no failure and must not escalate again.
        let built_now = builds.last().is_some_and(|b| b.run_id == Some(ctx.run_id));
        let mut triggers = Vec::new();
        let threshold = *self.rules.repeated_failure.get_ref();
        if built_now && consecutive >= threshold as usize {
            triggers.push(json!({
                "trigger": "REPEATED_FAILURE",
                "reason": format!("{consecutive} consecutive failed attempts (threshold {threshold})"),
            }));
        }
        if Rules::names(&self.rules.security_kinds, &kind) {
            triggers.push(
                json!({ "trigger": "SECURITY_CLASS", "reason": format!("a {kind} failure") }),
            );
        }
        if Rules::names(&self.rules.ambiguous_kinds, &kind) {
            triggers.push(json!({ "trigger": "AMBIGUOUS", "reason": format!("a {kind} failure") }));
        }
        if let Some(build) = builds.last().filter(|_| built_now) {
            triggers.extend(self.advisory_triggers(ctx, build)?);
        }
        if triggers.is_empty() {
            return Ok(NodeOutcome::succeeded(json!({
                "triggers": [],
                "consecutive_failures": consecutive,
            })));
        }
        let outputs =
            serde_json::Map::from_iter([("consecutive_failures".to_owned(), json!(consecutive))]);
        super::review::stop_for_review(
            ctx,
            &mut ledger,
            &skill,
            serde_json::Value::Array(triggers),
            Some(&self.rules_hash),
            outputs,
        )
    }
}

#[async_trait::async_trait]
impl NodeAction for Escalate {
    fn describe(&self) -> String {
        format!(
            "escalate {} to a person when the escalation rules say so",
            self.skill
        )
    }

    async fn run(&self, ctx: &NodeContext<'_>) -> NodeOutcome {
        self.evaluate(ctx).unwrap_or_else(NodeOutcome::failed)
    }
}
