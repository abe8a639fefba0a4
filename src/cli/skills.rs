//! `kavi skill propose|show`.

use serde_json::json;

use super::output::{short_hash, table};
use crate::config::Workspace;
use crate::diagnostic::SourceFile;
use crate::error::{Error, exit};
use crate::ledger::{ArtifactStore, Ledger, NewSkill};
use crate::skills::{Lifecycle, Proposal};
use crate::spec::SpecError;

const LIFECYCLE: &str = "policies/lifecycle.toml";

fn actor() -> String {
    std::env::var("USER").unwrap_or_else(|_| "unknown".into())
}

pub fn propose(workspace: &Workspace, file: &str, json: bool) -> Result<i32, Error> {
    let text = std::fs::read_to_string(file).map_err(|source| SpecError::Read {
        path: file.into(),
        source,
    })?;
    let source = SourceFile::new(file, text);
    let proposal = Proposal::parse(&source).map_err(SpecError::from)?;
    let lifecycle_source = crate::policy::read(&workspace.root, LIFECYCLE)
        .map_err(|message| SpecError::from(crate::diagnostic::Diagnostic::new(message)))?;
    let lifecycle = Lifecycle::parse(&lifecycle_source).map_err(SpecError::from)?;

    let store = ArtifactStore::open(&workspace.config.artifacts).map_err(|source| Error::Io {
        context: format!(
            "failed to open the artifact store at {}",
            workspace.config.artifacts.display()
        ),
        source,
    })?;
    let spec = store
        .put_bytes("SKILL_SPEC", source.text.as_bytes())
        .map_err(|source| Error::Io {
            context: "failed to store the skill spec".into(),
            source,
        })?;
    let mut ledger = Ledger::open(&workspace.config.ledger)?;
    let name = proposal.name.get_ref();
    ledger.propose_skill(&NewSkill {
        name,
        description: &proposal.description,
        side_effect: proposal.side_effect.as_str(),
        spec: &spec,
        initial_state: &lifecycle.initial,
        actor: &actor(),
    })?;
    if json {
        let skill = ledger.skill(name)?;
        println!(
            "{}",
            serde_json::to_string_pretty(&skill).expect("skill serializes")
        );
    } else {
        println!(
            "proposed skill `{name}` ({}): {}, spec {}",
            proposal.side_effect.as_str(),
            lifecycle.initial,
            short_hash(&spec.sha256)
        );
    }
    Ok(exit::SUCCESS)
}

pub fn show(workspace: &Workspace, name: &str, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open(&workspace.config.ledger)?;
    let skill = ledger.skill(name)?;
    let transitions = ledger.skill_transitions(name)?;
    if json {
        let value = json!({ "skill": skill, "transitions": transitions });
        println!(
            "{}",
            serde_json::to_string_pretty(&value).expect("skill serializes")
        );
        return Ok(exit::SUCCESS);
    }
    println!("skill {}: {}", skill.name, skill.state);
    println!("  {}", skill.description);
    println!("  side effect  {}", skill.side_effect);
    println!("  spec         sha256:{}", skill.spec_artifact);
    println!();
    let mut rows = vec![
        ["FROM", "TO", "RUN", "NODE", "BY", "AT"]
            .map(String::from)
            .to_vec(),
    ];
    for t in &transitions {
        rows.push(vec![
            t.from_state.clone().unwrap_or_else(|| "-".into()),
            t.to_state.clone(),
            t.run_id.map_or_else(|| "-".into(), |id| id.to_string()),
            t.node_id.clone().unwrap_or_else(|| "-".into()),
            t.actor.clone(),
            t.at.clone(),
        ]);
    }
    print!("{}", table(&rows));
    Ok(exit::SUCCESS)
}
