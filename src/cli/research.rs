//! `kavi research BUILD_ID [--advise]`: classify a build's failed attempt by hand and write a
//! research note, as the forge's `classify` node would; with `--advise`, also ask the LLM
//! gateway for a revised packet, as its `advise` node would. Both are recorded on the build, so
//! the skill's next attempt carries them.

use serde_json::{Value, json};

use super::output::short_hash;
use crate::config::Workspace;
use crate::confinement::network::{self, NetworkPolicy};
use crate::error::{Error, exit};
use crate::ledger::Ledger;
use crate::policy::classifier::Classifier;
use crate::research::advisory::{Advice, Advisor};
use crate::research::{ResearchError, Step, research};
use crate::template::TemplateEngine;

/// Where `kavi research` finds its rules: the forge's defaults.
const CLASSIFIER: &str = crate::policy::classifier::DEFAULT_POLICY;

fn policy_error(message: impl std::fmt::Display) -> Error {
    Error::Usage(message.to_string())
}

pub async fn run(
    workspace: &Workspace,
    build_id: i64,
    advise: bool,
    json: bool,
) -> Result<i32, Error> {
    let mut ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let build = ledger.build(build_id)?;
    let run_id = build
        .run_id
        .ok_or_else(|| Error::Usage(format!("build {build_id} records no run to look into")))?;
    let detail = ledger.run_detail(run_id)?;
    let entries: Vec<(String, Value)> = crate::ledger::final_attempts(&detail.nodes)
        .into_iter()
        .map(|n| {
            let outputs = n.outputs.clone().unwrap_or_else(|| json!({}));
            (
                n.node_id.clone(),
                json!({ "kind": n.kind, "state": n.state, "error": n.error, "outputs": outputs }),
            )
        })
        .collect();
    let steps: Vec<Step<'_>> = entries
        .iter()
        .map(|(id, entry)| Step { id, entry })
        .collect();

    let source = crate::policy::read(&workspace.root, CLASSIFIER).map_err(policy_error)?;
    let node_kinds: Vec<&str> = crate::nodes::registry().names().collect();
    let classifier = Classifier::parse(&source, &node_kinds).map_err(policy_error)?;
    let artifacts = super::open_store(workspace)?;
    let found = research(&classifier, &artifacts, &steps, Some(&build.skill), run_id).map_err(
        |e| match e {
            ResearchError::NothingFailed(_) => Error::Usage(format!(
                "build {build_id} (attempt {} of `{}`, run {run_id}) did not fail; there is nothing to classify",
                build.attempt, build.skill
            )),
            ResearchError::Store(source) => Error::Io {
                context: "failed to store the research note".into(),
                source,
            },
        },
    )?;
    ledger.record_research(build_id, &found.kind, &found.note)?;

    let advice = if advise {
        let source =
            crate::policy::read(&workspace.root, network::DEFAULT_POLICY).map_err(policy_error)?;
        let network = NetworkPolicy::parse(&source).map_err(policy_error)?;
        let templates = TemplateEngine::new(&workspace.templates_dir());
        let advisor = Advisor {
            gateway: &workspace.config.gateway,
            network: &network,
            templates: &templates,
            artifacts: &artifacts,
        };
        Some(
            advisor
                .advise(&mut ledger, build_id)
                .await
                .map_err(Error::Usage)?,
        )
    } else {
        None
    };

    let advisory_json = match &advice {
        None => Value::Null,
        Some(Advice::Revised {
            artifact,
            prompt_chars,
            truncated,
        }) => json!({
            "advisory": artifact.sha256,
            "advisory_path": artifacts.path_of(artifact),
            "prompt_chars": prompt_chars,
            "prompt_truncated": truncated,
        }),
        Some(Advice::Unavailable(reason)) => json!({ "unavailable": reason }),
    };
    if json {
        let answer = json!({
            "build_id": build_id,
            "skill": build.skill,
            "attempt": build.attempt,
            "kind": found.kind,
            "facts": found.facts,
            "note": found.note.sha256,
            "note_path": artifacts.path_of(&found.note),
            "advice": advisory_json,
        });
        super::print_json(&answer);
    } else {
        outln!(
            "build {build_id} (`{}`, attempt {}): {} at `{}`",
            build.skill,
            build.attempt,
            found.kind,
            found.node
        );
        outln!(
            "  note      {} ({})",
            short_hash(&found.note.sha256),
            artifacts.path_of(&found.note).display()
        );
        match &advice {
            None => {}
            Some(Advice::Revised { artifact, .. }) => outln!(
                "  advisory  {} ({}); the next attempt's packet quotes it",
                short_hash(&artifact.sha256),
                artifacts.path_of(artifact).display()
            ),
            Some(Advice::Unavailable(reason)) => outln!("  advisory  none: {reason}"),
        }
    }
    // Asking for advice and getting none is a failure of what was asked.
    Ok(match advice {
        Some(Advice::Unavailable(_)) => exit::RUN_FAILED,
        _ => exit::SUCCESS,
    })
}
