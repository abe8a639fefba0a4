//! The `contract` gate: the skill, as its folder holds it now, run against each example of its
//! proposal through the path `kavi skill run` takes ([`crate::executions::Runner`]): a read-only
//! snapshot of its files, its class's run-time profile, its output checked against the output
//! schema. Each example runs in a scratch workspace of its own, holding only the example's
//! `files`, so a FILE_WRITE skill writes nothing of the real workspace and a READ_ONLY one reads
//! only what the example gives it.

use std::path::Path;
use std::time::Duration;

use serde_json::json;

use super::Verdict;
use crate::confinement::policy::ConfinementPolicy;
use crate::executions::Runner;
use crate::node::NodeContext;
use crate::process::Violation;
use crate::skills::trust::TrustPolicy;

/// The skill a contract gate runs, and how.
pub(super) struct Candidate<'a> {
    pub workspace: &'a Path,
    pub name: &'a str,
    /// Its proposal file, relative to the workspace.
    pub proposal: &'a str,
    pub trust: &'a TrustPolicy,
    pub confinement: &'a ConfinementPolicy,
    /// How long each example's run may take.
    pub timeout: Duration,
    /// How many examples the proposal must declare.
    pub min_examples: usize,
}

impl Candidate<'_> {
    /// The runner `kavi skill run` would use, with `root` as its workspace; it logs nothing.
    fn runner<'r>(&'r self, ctx: &'r NodeContext<'_>, root: &'r Path) -> Runner<'r> {
        Runner {
            root,
            ledger: &ctx.env.ledger,
            held: None,
            // A pipeline's node runs its skills itself.
            pool: false,
            artifacts: &ctx.env.artifacts,
            templates: &ctx.env.templates,
            trust: self.trust,
            log: None,
            timeout: self.timeout,
            confinement: self.confinement,
            owner: &ctx.env.owner,
            kavi_state: &ctx.env.state_paths,
            deferred: None,
        }
    }

    /// Passes when every example's output is the example's; the failure names each example
    /// that broke the contract and how. `Err` when the skill could not be run at all.
    pub async fn check(
        &self,
        ctx: &NodeContext<'_>,
        evidence: &mut serde_json::Map<String, serde_json::Value>,
    ) -> Result<Verdict, String> {
        let ready =
            self.runner(ctx, self.workspace)
                .candidate(self.workspace, self.name, self.proposal)?;
        let examples = &ready.proposal.examples;
        if examples.len() < self.min_examples {
            evidence.insert("examples".to_owned(), json!({ "run": 0, "matched": 0 }));
            return Ok(Verdict::Failed(format!(
                "too_few_examples: {} declares {} example{}, and the gate set requires at least \
                 {} (`min_examples`): add `[[examples]]` with an input and the output it must give",
                self.proposal,
                examples.len(),
                if examples.len() == 1 { "" } else { "s" },
                self.min_examples
            )));
        }
        if examples.is_empty() {
            evidence.insert("examples".to_owned(), json!({ "run": 0, "matched": 0 }));
            return Ok(Verdict::PassedNoting(format!(
                "{} declares no examples: no contract to check",
                self.proposal
            )));
        }
        let mut broken = Vec::new();
        // What the confinement stopped a run for: an attack, not a broken contract.
        let mut stopped: Option<Violation> = None;
        for (n, example) in examples.iter().enumerate() {
            let example = example.get_ref();
            // In the owner's roster as it is made, so that a killed kavi's next run removes it.
            let scratch = crate::sandbox::private_temp(&ctx.env.sandboxes, "kavi-tmp-contract-")
                .and_then(|scratch| ctx.env.owner.track(scratch.path()).map(|()| scratch))
                .map_err(|e| format!("failed to make the example's scratch workspace: {e}"))?;
            for (path, text) in &example.files {
                let file = scratch.path().join(path);
                if let Some(folder) = file.parent() {
                    std::fs::create_dir_all(folder)
                        .map_err(|e| format!("failed to make {}: {e}", folder.display()))?;
                }
                std::fs::write(&file, text)
                    .map_err(|e| format!("failed to write the example's {path}: {e}"))?;
            }
            let (outcome, violation) = self
                .runner(ctx, scratch.path())
                .try_example(&ready, &example.input, &ctx.cancel)
                .await
                .map_err(|e| e.to_string())?;
            if ctx.cancel.is_cancelled() {
                return Err("cancelled".into());
            }
            // A security violation names the attempt over a bound outgrown.
            if let Some(violation) = violation
                && stopped.as_ref().is_none_or(|first| !first.is_security())
            {
                stopped = Some(violation);
            }
            match outcome {
                Err(why) => broken.push(format!("example {}: {why}", n + 1)),
                Ok(output) if output != example.output => broken.push(format!(
                    "example {}: the output is not the example's: got {output}, the contract \
                     says {}",
                    n + 1,
                    example.output
                )),
                Ok(_) => {}
            }
        }
        let matched = examples.len() - broken.len();
        evidence.insert(
            "examples".to_owned(),
            json!({ "run": examples.len(), "matched": matched }),
        );
        if let Some(violation) = stopped {
            // Named as a build or a command gate stopped for it would be: SECURITY_VIOLATION
            // goes to a person at once.
            return Ok(Verdict::FailedAs {
                kind: violation.failure_kind().to_owned(),
                detail: format!(
                    "running its examples, the skill was {violation} ({matched} of {} \
                     matched)\n{}",
                    examples.len(),
                    broken.join("\n")
                ),
            });
        }
        if broken.is_empty() {
            Ok(Verdict::PassedNoting(format!(
                "{matched} of {matched} examples matched"
            )))
        } else {
            Ok(Verdict::Failed(format!(
                "the skill breaks its contract ({matched} of {} examples matched)\n{}",
                examples.len(),
                broken.join("\n")
            )))
        }
    }
}
