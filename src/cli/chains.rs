//! `kavi chain run|check`.

use std::path::Path;

use super::output::{duration_ms, one_line};
use super::skills::{SkillEnv, confirm};
use crate::chains::{self, Chain, ChainContext, Confirm, StepResult};
use crate::config::Workspace;
use crate::diagnostic::Diagnostics;
use crate::error::{Error, exit};
use crate::executions::Lineage;
use crate::skills::SideEffects;
use crate::template::TemplateEngine;

fn load(workspace: &Workspace, file: &str) -> Result<Chain, Error> {
    let path = crate::spec::resolve_spec_path(&workspace.root, "chains", "chain", file)?;
    let display = path
        .strip_prefix(&workspace.root)
        .map_or_else(|_| path.clone(), Path::to_path_buf);
    let templates = TemplateEngine::new(&workspace.templates_dir());
    Ok(chains::load(&path, &display, &templates)?)
}

pub fn check(workspace: &Workspace, file: &str, json: bool) -> Result<i32, Error> {
    let chain = load(workspace, file)?;
    if json {
        super::print_json(&serde_json::json!({
            "ok": true,
            "file": chain.source.path,
            "chain": chain.name,
            "steps": chain.steps.len(),
            "params": chain.params.len(),
            "problems": [],
        }));
    } else {
        outln!(
            "{}: chain `{}` is valid ({} steps, {} parameters)",
            chain.source.path.display(),
            chain.name,
            chain.steps.len(),
            chain.params.len()
        );
    }
    Ok(exit::SUCCESS)
}

/// `--yes` confirms every side effect; otherwise each is asked about on the terminal, and
/// refused without one.
struct CliConfirm {
    yes: bool,
}

impl Confirm for CliConfirm {
    fn confirmed(&self, skill: &str, class: SideEffects) -> bool {
        self.yes || confirm(skill, class).unwrap_or(false)
    }
}

pub async fn run(
    workspace: &Workspace,
    file: &str,
    sets: &[(String, String)],
    yes: bool,
    json: bool,
) -> Result<i32, Error> {
    let chain = load(workspace, file)?;
    let params = crate::spec::resolve_params(&chain.params, sets)
        .map_err(|problems| Error::Usage(Diagnostics(problems).to_string()))?;
    let env = SkillEnv::load(workspace)?;
    let runner = env.runner(workspace, true);
    let cancel = super::cancel_on_signals("the chain");
    let context = ChainContext {
        runner: &runner,
        templates: &env.templates,
        confirm: &CliConfirm { yes },
        lineage: Lineage::default(),
        cancel: &cancel,
    };
    let results = chains::run(&chain, &params, &context).await?;
    if json {
        super::print_json(&results);
    } else {
        print_results(&chain, &results);
    }
    Ok(if results.iter().all(|r| r.status == "succeeded") {
        exit::SUCCESS
    } else if cancel.is_cancelled() {
        super::cancelled_exit_code()
    } else {
        exit::RUN_FAILED
    })
}

fn print_results(chain: &Chain, results: &[StepResult]) {
    outln!("chain {} ({} steps)", chain.name, results.len());
    for result in results {
        match &result.record {
            None => outln!(
                "  skip   {} ({}): not run, an earlier step failed",
                result.id,
                result.skill
            ),
            Some(record) if record.success => outln!(
                "  ok     {} ({}) {} in {}: {}",
                result.id,
                result.skill,
                &record.execution_id[..8],
                duration_ms(record.duration_ms),
                record.output.clone().unwrap_or_default()
            ),
            Some(record) => outln!(
                "  FAIL   {} ({}) {}: {}",
                result.id,
                result.skill,
                &record.execution_id[..8],
                one_line(record.error.as_deref().unwrap_or("unknown"))
            ),
        }
    }
    let failed = results.iter().filter(|r| r.status != "succeeded").count();
    if failed == 0 {
        outln!(
            "chain {} succeeded; see the tree with: kavi session --latest",
            chain.name
        );
    } else {
        outln!(
            "chain {} failed ({failed} of {} steps did not succeed); see: kavi session --latest",
            chain.name,
            results.len()
        );
    }
}
