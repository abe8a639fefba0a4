//! The lifecycle policy (`policies/lifecycle.toml`): the states a skill moves through, the
//! transitions allowed, who approves them, and when a skill may be built.

use std::sync::Arc;

use serde::Deserialize;
use toml::Spanned;

use super::TRUSTED;
use crate::diagnostic::{Diagnostic, SourceFile};
use crate::ledger::Evidence;
use crate::roles::{Requirement, Roles};

/// `policies/lifecycle.toml`, as written.
#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawLifecycle {
    #[schemars(with = "String")]
    pub(super) initial: Spanned<String>,
    #[schemars(with = "Vec<String>")]
    pub(super) states: Vec<Spanned<String>>,
    #[schemars(with = "Vec<String>")]
    pub(super) buildable: Vec<Spanned<String>>,
    /// Where re-verification moves a trusted skill whose files changed.
    #[schemars(with = "Option<String>")]
    pub(super) drifted: Option<Spanned<String>>,
    /// Where `kavi skill revoke` moves a skill.
    #[schemars(with = "Option<String>")]
    revoked: Option<Spanned<String>>,
    /// Where `kavi reject` moves the skill of a rejected run.
    #[schemars(with = "Option<String>")]
    pub(super) rejected: Option<Spanned<String>>,
    /// States a skill may stay in for good: not dead ends.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    pub(super) terminal: Vec<Spanned<String>>,
    #[serde(rename = "transition", default)]
    pub(super) transitions: Vec<RawTransition>,
}

#[derive(Debug, Clone, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub(super) struct RawTransition {
    #[schemars(with = "String")]
    pub(super) from: Spanned<String>,
    #[schemars(with = "String")]
    pub(super) to: Spanned<String>,
    /// `true` (one approval), or `{ approvals = N }`: N accounts other than the run's starter.
    #[schemars(with = "Option<RawApproval>")]
    pub(super) approval: Option<Spanned<RawApproval>>,
    #[expect(dead_code, reason = "documentation for people reading the policy")]
    pub(super) description: Option<String>,
}

/// A transition's `approval`, as written.
#[derive(Debug, Clone, schemars::JsonSchema)]
#[serde(untagged)]
pub(super) enum RawApproval {
    Flag(bool),
    Requirement(Requirement),
}

/// By hand, so that a requirement's own error (a missing `role`, say) is the one reported,
/// where an untagged enum only says that no form matched.
impl<'de> Deserialize<'de> for RawApproval {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        match toml::Value::deserialize(deserializer)? {
            toml::Value::Boolean(flag) => Ok(Self::Flag(flag)),
            table @ toml::Value::Table(_) => Requirement::deserialize(table)
                .map(Self::Requirement)
                .map_err(|e| D::Error::custom(format!("`approval`: {}", e.message()))),
            _ => Err(D::Error::custom(
                "`approval` is `true`, or the approvals a role gives, as \
                 `{ role = \"reviewer\", approvals = 2 }`",
            )),
        }
    }
}

/// What a move needs before it is made. `approval = true` is one recorded approval, which the
/// starter may give unless the escalation rules forbid it (`self_approval`);
/// `{ role = "reviewer", approvals = 2 }` needs that many distinct accounts holding the role in
/// `policies/roles.toml`, never the run's starter.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Recorded,
    Roles(Requirement),
}

impl std::fmt::Display for Approval {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Recorded => write!(f, "a recorded approval"),
            Self::Roles(Requirement { role, approvals: 1 }) => write!(
                f,
                "an approval by an account holding `{role}` other than the run's starter"
            ),
            Self::Roles(Requirement { role, approvals }) => write!(
                f,
                "{approvals} approvals by distinct accounts holding `{role}` other than the \
                 run's starter"
            ),
        }
    }
}

/// The lifecycle state machine: which moves are allowed, and which need an approval.
#[derive(Debug, Clone)]
pub struct Lifecycle {
    pub initial: String,
    pub states: Vec<String>,
    pub buildable: Vec<String>,
    /// Where re-verification moves a trusted skill whose files changed (such as SUSPENDED).
    pub drifted: Option<String>,
    /// Where `kavi skill revoke` moves a skill (such as REVOKED).
    pub revoked: Option<String>,
    /// Where `kavi reject` moves the skill of a rejected run (such as REJECTED).
    pub rejected: Option<String>,
    /// States a skill may stay in for good.
    pub terminal: Vec<String>,
    /// (from, to, what it needs before it is made)
    pub(super) transitions: Vec<(String, String, Option<Approval>)>,
    pub source: Arc<SourceFile>,
    /// The file as written, for diagnostics that point into it.
    pub(super) declared: RawLifecycle,
}

impl Lifecycle {
    /// Parses and checks a lifecycle policy: every state it names must be declared, and it may
    /// have none of [`Lifecycle::problems`].
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let lifecycle = Self::parse_declared(source)?;
        match lifecycle.problems().into_iter().next() {
            Some(problem) => Err(problem),
            None => Ok(lifecycle),
        }
    }

    /// Parses a lifecycle policy without looking for its problems: for `kavi policy check`,
    /// which lists them all.
    pub fn parse_declared(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawLifecycle =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let states: Vec<String> = raw.states.iter().map(|s| s.get_ref().clone()).collect();
        let known = |state: &Spanned<String>| -> Result<String, Diagnostic> {
            if states.contains(state.get_ref()) {
                Ok(state.get_ref().clone())
            } else {
                Err(Diagnostic::new(format!(
                    "`{}` is not one of the declared states",
                    state.get_ref()
                ))
                .at(source, state.span())
                .with_help(format!("declared states: {}", states.join(", "))))
            }
        };
        let initial = known(&raw.initial)?;
        let buildable = raw.buildable.iter().map(known).collect::<Result<_, _>>()?;
        let drifted = raw.drifted.as_ref().map(known).transpose()?;
        let revoked = raw.revoked.as_ref().map(known).transpose()?;
        let rejected = raw.rejected.as_ref().map(known).transpose()?;
        let terminal = raw.terminal.iter().map(known).collect::<Result<_, _>>()?;
        let mut transitions = Vec::new();
        for t in &raw.transitions {
            let approval = match t.approval.as_ref().map(Spanned::get_ref) {
                None | Some(RawApproval::Flag(false)) => None,
                Some(RawApproval::Flag(true)) => Some(Approval::Recorded),
                Some(RawApproval::Requirement(requirement)) => {
                    Some(Approval::Roles(requirement.clone()))
                }
            };
            transitions.push((known(&t.from)?, known(&t.to)?, approval));
        }
        Ok(Self {
            initial,
            states,
            buildable,
            drifted,
            revoked,
            rejected,
            terminal,
            transitions,
            source: Arc::clone(source),
            declared: raw,
        })
    }

    /// Whether any transition leads to `state`.
    pub fn has_way_into(&self, state: &str) -> bool {
        self.transitions.iter().any(|(_, to, _)| to == state)
    }

    /// Everything that keeps the forge and kavi's commands from carrying this lifecycle out, each
    /// pointing into the file: TRUSTED undeclared; a state no chain of transitions reaches from
    /// `initial`; a state from which none reaches TRUSTED (unless it is `terminal`); a state
    /// both buildable and terminal; a buildable state no transition leads to; a move kavi makes
    /// without a person (revoke, drift, restore, reject) that is missing or needs an approval.
    pub fn problems(&self) -> Vec<Diagnostic> {
        let at = |message: String, span: std::ops::Range<usize>| {
            Diagnostic::new(message).at(&self.source, span)
        };
        let mut found = Vec::new();
        if !self.states.iter().any(|s| s == TRUSTED) {
            found.push(
                at(
                    format!(
                        "the lifecycle declares no {TRUSTED} state, the state whose skills run"
                    ),
                    self.declared.initial.span(),
                )
                .with_help(format!("add \"{TRUSTED}\" to `states`")),
            );
            return found;
        }
        let reached = self.closure(&self.initial, false);
        let reaches = self.closure(TRUSTED, true);
        for state in &self.declared.states {
            let name = state.get_ref();
            if !reached.contains(name) {
                found.push(
                    at(
                        format!(
                            "`{name}` is unreachable: no chain of transitions leads to it from \
                             `initial` ({})",
                            self.initial
                        ),
                        state.span(),
                    )
                    .with_help("add a [[transition]] into it, or remove it from `states`"),
                );
            }
            if !reaches.contains(name) && !self.terminal.contains(name) {
                found.push(
                    at(
                        format!(
                            "`{name}` is a dead end: no chain of transitions leads from it to {TRUSTED}"
                        ),
                        state.span(),
                    )
                    .with_help(
                        "add a [[transition]] out of it, or list it in `terminal` if a skill may \
                         stay there for good",
                    ),
                );
            }
        }
        for state in &self.declared.buildable {
            let name = state.get_ref();
            if self.terminal.contains(name) {
                found.push(
                    at(
                        format!(
                            "`{name}` is both buildable and terminal: a build would overwrite a \
                             skill that is meant to stay {name} for good"
                        ),
                        state.span(),
                    )
                    .with_help("remove it from `buildable` or from `terminal`"),
                );
            }
            if name != &self.initial && !self.has_way_into(name) {
                found.push(at(
                    format!("buildable state `{name}` has no way in: no transition leads to it"),
                    state.span(),
                ));
            }
        }
        // The moves kavi's commands make without a person, each declared by the key that
        // names its state: they must exist, and no approval can be given for them.
        let mut unattended: Vec<(&str, String, String, std::ops::Range<usize>)> = Vec::new();
        if let (Some(drifted), Some(key)) = (&self.drifted, &self.declared.drifted) {
            for (from, to, by) in [
                (TRUSTED, drifted.as_str(), "`kavi skill verify` (on drift)"),
                (drifted.as_str(), TRUSTED, "`kavi skill restore`"),
            ] {
                unattended.push((by, from.to_owned(), to.to_owned(), key.span()));
            }
        }
        if let (Some(revoked), Some(key)) = (&self.revoked, &self.declared.revoked) {
            for from in std::iter::once(TRUSTED).chain(self.drifted.as_deref()) {
                let by = "`kavi skill revoke`";
                unattended.push((by, from.to_owned(), revoked.clone(), key.span()));
            }
        }
        if let (Some(rejected), Some(key)) = (&self.rejected, &self.declared.rejected) {
            // A run may stop for review with its skill in any state but these.
            for from in self
                .states
                .iter()
                .filter(|s| *s != TRUSTED && *s != rejected && !self.terminal.contains(s))
            {
                let by = "`kavi reject`";
                unattended.push((by, from.clone(), rejected.clone(), key.span()));
            }
        }
        for (by, from, to, key) in unattended {
            match self.declared_move(&from, &to) {
                None => found.push(
                    at(
                        format!("no transition {from} -> {to} is declared: {by} makes that move"),
                        key,
                    )
                    .with_help(format!(
                        "add [[transition]] from = \"{from}\" to = \"{to}\", without `approval`"
                    )),
                ),
                Some(Some((approval, span))) => found.push(
                    at(
                        format!(
                            "the transition {from} -> {to} needs {approval}, but {by} makes it \
                             without stopping for one: it could never happen"
                        ),
                        span,
                    )
                    .with_help("remove its `approval`"),
                ),
                Some(None) => {}
            }
        }
        found
    }

    /// The approvals no one could give, given the workspace's roles (`None`: it has no roles
    /// file): a role that is not declared, `approvals = 0`, or more approvals than the role has
    /// members when its members are all named accounts. Each points at its `approval`.
    pub fn role_problems(&self, roles: Option<&Roles>) -> Vec<Diagnostic> {
        let mut found = Vec::new();
        for ((from, to, approval), declared) in
            self.transitions.iter().zip(&self.declared.transitions)
        {
            let (Some(Approval::Roles(requirement)), Some(written)) =
                (approval, &declared.approval)
            else {
                continue;
            };
            let span = written.span();
            let refused = |reason: String| {
                Diagnostic::new(format!(
                    "no one can give the approval {from} -> {to} needs: {reason}"
                ))
                .at(&self.source, span.clone())
            };
            let Some(roles) = roles else {
                found.push(refused(format!(
                    "role `{}` is named, but the workspace has no {}",
                    requirement.role,
                    crate::roles::DEFAULT_POLICY
                )));
                continue;
            };
            if let Err(problem) = roles.check(requirement, &self.source, span.clone()) {
                found.push(problem);
                continue;
            }
            if let Some(members) = roles.named_members(&requirement.role)
                && members < requirement.approvals as usize
            {
                found.push(refused(format!(
                    "role `{}` has {members} named members, fewer than the {} approvals needed",
                    requirement.role, requirement.approvals
                )));
            }
        }
        found
    }

    /// The declared move `from -> to`, if any, with the approval it needs and where that is
    /// written.
    fn declared_move(
        &self,
        from: &str,
        to: &str,
    ) -> Option<Option<(&Approval, std::ops::Range<usize>)>> {
        let i = self
            .transitions
            .iter()
            .position(|(f, t, _)| f == from && t == to)?;
        let written = self.declared.transitions[i].approval.as_ref();
        Some(
            self.transitions[i]
                .2
                .as_ref()
                .zip(written.map(Spanned::span)),
        )
    }

    /// The states reached from `start` by following transitions (`backwards`: the states
    /// from which `start` is reached).
    fn closure(&self, start: &str, backwards: bool) -> Vec<String> {
        let mut seen = vec![start.to_owned()];
        let mut grew = true;
        while grew {
            grew = false;
            for (from, to, _) in &self.transitions {
                let (from, to) = if backwards { (to, from) } else { (from, to) };
                if seen.contains(from) && !seen.contains(to) {
                    seen.push(to.clone());
                    grew = true;
                }
            }
        }
        seen
    }

    /// Whether a move `from -> to` must rest on a gate run that passed, whichever node or
    /// pipeline makes it: a move into a state on the way to trust (VERIFIED) from one that is
    /// not. Trust itself is earned by a promotion.
    fn needs_gates(&self, from: &str, to: &str) -> bool {
        to != TRUSTED && self.toward_trusted(to).is_some() && self.toward_trusted(from).is_none()
    }

    /// What the ledger must hold for a move `from -> to`, whichever node, command or approval
    /// makes it: a gate run for a move onto the way to trust (see [`Lifecycle::needs_gates`]),
    /// a build copied back or an import for a move into a state the gates are run from
    /// (BUILT), nothing otherwise. Trust itself is earned by a promotion.
    pub fn evidence(&self, from: &str, to: &str) -> Evidence {
        if self.needs_gates(from, to) {
            Evidence::Gated
        } else if from != to
            && self
                .transitions
                .iter()
                .any(|(f, t, _)| f == to && self.needs_gates(to, t))
        {
            Evidence::Built
        } else {
            Evidence::Nothing
        }
    }

    /// Checks a move as [`Lifecycle::check`] does, and says what it must rest on.
    pub fn check_move(&self, from: &str, to: &str) -> Result<Evidence, String> {
        self.check(from, to).map(|()| self.evidence(from, to))
    }

    /// The next move of a verified skill in state `from` toward TRUSTED, and what it needs: the
    /// first of the shortest chain of transitions to TRUSTED that passes through no buildable,
    /// terminal, drifted, revoked or rejected state (a promotion never rebuilds, nor leaves the
    /// way to trust), from a state that is none of these either: a buildable skill (BUILT, say)
    /// has no such way, since the gates, not a promotion, earn the verified state. `promote` and
    /// `kavi approve` walk it one move at a time.
    pub fn toward_trusted(&self, from: &str) -> Option<(String, Option<Approval>)> {
        let passable = |state: &String| {
            state == TRUSTED
                || !(self.buildable.contains(state)
                    || self.terminal.contains(state)
                    || [&self.drifted, &self.revoked, &self.rejected]
                        .iter()
                        .any(|key| key.as_ref() == Some(state)))
        };
        // Distances to TRUSTED, walking backwards through passable states.
        let mut distance: Vec<(String, usize)> = vec![(TRUSTED.to_owned(), 0)];
        let mut frontier = vec![TRUSTED.to_owned()];
        while !frontier.is_empty() {
            let mut next = Vec::new();
            for (f, t, _) in &self.transitions {
                if frontier.contains(t) && !distance.iter().any(|(s, _)| s == f) && passable(f) {
                    let d = distance
                        .iter()
                        .find(|(s, _)| s == t)
                        .map_or(0, |(_, d)| d + 1);
                    distance.push((f.clone(), d));
                    next.push(f.clone());
                }
            }
            frontier = next;
        }
        let here = distance.iter().find(|(s, _)| s == from)?.1;
        self.transitions
            .iter()
            .find(|(f, t, _)| f == from && distance.iter().any(|(s, d)| s == t && *d + 1 == here))
            .map(|(_, t, approval)| (t.clone(), approval.clone()))
    }

    /// Whether a skill left in `state` on the way to TRUSTED (its promotion refused) is built
    /// again: the lifecycle declares a move from it back to a buildable state, which a new
    /// build makes. A skill that awaits a person's decision there is held by the escalation.
    pub fn rebuilds(&self, state: &str) -> bool {
        self.toward_trusted(state).is_some()
            && self.transitions.iter().any(|(f, t, approval)| {
                f == state && approval.is_none() && self.buildable.contains(t)
            })
    }

    /// What the move needs before it is made, if it is declared with an `approval`.
    pub fn needs_approval(&self, from: &str, to: &str) -> Option<&Approval> {
        self.transitions
            .iter()
            .find(|(f, t, _)| f == from && t == to)
            .and_then(|(_, _, approval)| approval.as_ref())
    }

    /// Whether any move needs approvals by a role.
    pub fn has_role_approvals(&self) -> bool {
        self.transitions
            .iter()
            .any(|(_, _, approval)| matches!(approval, Some(Approval::Roles(_))))
    }

    /// Whether any move needs an approval.
    pub fn has_approvals(&self) -> bool {
        self.transitions
            .iter()
            .any(|(_, _, approval)| approval.is_some())
    }

    /// Checks a move that a person approved: declared, approval or not. An approval stands in
    /// for the person's decision only, never for what the move rests on.
    pub fn check_approved(&self, from: &str, to: &str) -> Result<Evidence, String> {
        if self.needs_approval(from, to).is_some() {
            Ok(self.evidence(from, to))
        } else {
            self.check_move(from, to)
        }
    }

    /// Checks a move; the error says what is allowed instead.
    pub fn check(&self, from: &str, to: &str) -> Result<(), String> {
        match self
            .transitions
            .iter()
            .find(|(f, t, _)| f == from && t == to)
        {
            Some((_, _, None)) => Ok(()),
            Some((_, _, Some(approval))) => Err(format!(
                "the transition {from} -> {to} needs {approval} ({})",
                self.source.path.display()
            )),
            None => {
                let allowed: Vec<&str> = self
                    .transitions
                    .iter()
                    .filter(|(f, _, _)| f == from)
                    .map(|(_, t, _)| t.as_str())
                    .collect();
                let instead = if allowed.is_empty() {
                    format!("no transition leaves {from}")
                } else {
                    format!("from {from} it allows: {}", allowed.join(", "))
                };
                Err(format!(
                    "the transition {from} -> {to} is not allowed by {} ({instead})",
                    self.source.path.display()
                ))
            }
        }
    }
}

/// Why `skill` may not be built now, if it may not: its state is not buildable, or a person's
/// review of it is pending or ended in a rejection. The forge asks before each attempt.
pub fn build_refusal(
    ledger: &crate::ledger::Ledger,
    lifecycle: &Lifecycle,
    skill: &str,
) -> Result<Option<String>, crate::ledger::LedgerError> {
    let row = ledger.skill(skill)?;
    let state = row.state;
    let not_buildable = (!lifecycle.buildable.contains(&state) && !lifecycle.rebuilds(&state))
        .then(|| {
            let refusal = format!(
                "`{skill}` is {state}, which is not buildable (buildable: {})",
                lifecycle.buildable.join(", ")
            );
            // Forging a trusted skill again is how a new version starts: say how.
            match state == TRUSTED {
                true => format!(
                    "{refusal}; to build version {next}, edit {path}: the next forge builds it \
                     while version {now} keeps running",
                    next = row.version + 1,
                    path = row.proposal_path,
                    now = row.version,
                ),
                false => refusal,
            }
        });
    // A person's pending or negative decision says more than the state it left the skill in.
    // A decision about an older version (one rejected, say) does not bind a newer one.
    let Some(escalation) = ledger
        .latest_escalation(skill)?
        .filter(|e| e.raised_at >= row.version_proposed_at)
    else {
        return Ok(not_buildable);
    };
    Ok(match escalation.status.as_str() {
        "pending" => Some(format!(
            "`{skill}` awaits review since run {run}; decide with `kavi approve {run}` or `kavi reject {run}`",
            run = ledger.root_run(escalation.run_id)?.id
        )),
        "rejected" => Some(format!(
            "`{skill}` was rejected in review of run {} by {}{}; it is not built again",
            ledger.root_run(escalation.run_id)?.id,
            escalation.decided_by.as_deref().unwrap_or("unknown"),
            escalation
                .comment
                .as_deref()
                .map(|c| format!(" ({c})"))
                .unwrap_or_default()
        )),
        _ => not_buildable,
    })
}
