//! `kavi doctor`: is this workspace ready? Each check says ok, warn or FAIL with a detail; the
//! command exits 1 when any check failed. Nothing is changed and nothing is sent anywhere.

use serde::Serialize;

use super::output::table;
use crate::config::Workspace;
use crate::confinement::network::{self, NetworkPolicy};
use crate::error::{Error, exit};
use crate::ledger::{ArtifactStore, Ledger};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
enum Status {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Serialize)]
struct Check {
    check: String,
    status: Status,
    detail: String,
}

fn check(name: impl Into<String>, status: Status, detail: impl Into<String>) -> Check {
    Check {
        check: name.into(),
        status,
        detail: detail.into(),
    }
}

/// Whether a program is on PATH (or, with a `/`, exists).
fn on_path(program: &str) -> bool {
    if program.contains('/') {
        return std::path::Path::new(program).is_file();
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).any(|dir| dir.join(program).is_file()))
        .unwrap_or(false)
}

fn checks(workspace: &Workspace) -> Vec<Check> {
    let mut found = Vec::new();
    let config = &workspace.config;
    found.push(check(
        "workspace",
        Status::Ok,
        match &workspace.config_file {
            Some(file) => format!("{} (config {})", workspace.root.display(), file.display()),
            None => format!("{} (no kavi.toml: defaults)", workspace.root.display()),
        },
    ));
    // Doctor only reads: a workspace where nothing was recorded yet has no ledger, and that is
    // fine (the first run makes it and the artifact store).
    let on_server = crate::ledger::postgres_url(&config.ledger).is_some();
    if !on_server && !config.ledger.exists() {
        found.push(check(
            "ledger",
            Status::Ok,
            format!(
                "none yet at {} (the first run makes it)",
                config.ledger.display()
            ),
        ));
    } else {
        found.extend(ledger_checks(workspace));
    }
    found.push(if !config.artifacts.exists() {
        check(
            "artifacts",
            Status::Ok,
            format!(
                "none yet at {} (the first run makes it)",
                config.artifacts.display()
            ),
        )
    } else {
        artifacts_check(workspace)
    });

    for (shown, loaded) in super::listing::workspace_pipelines(workspace) {
        let name = shown.display().to_string();
        found.push(match loaded {
            Ok(pipeline) => check(name, Status::Ok, format!("{} nodes", pipeline.nodes.len())),
            Err(e) => check(
                name,
                Status::Fail,
                super::listing::first_line(&e.to_string()),
            ),
        });
    }
    for (shown, loaded) in super::listing::workspace_chains(workspace) {
        let name = shown.display().to_string();
        found.push(match loaded {
            Ok(chain) => check(name, Status::Ok, format!("{} steps", chain.steps.len())),
            Err(e) => check(
                name,
                Status::Fail,
                super::listing::first_line(&e.to_string()),
            ),
        });
    }

    // The builder is a shell command line; its first word must be a program.
    let builder = shlex::split(&config.builder)
        .and_then(|words| words.into_iter().next())
        .unwrap_or_default();
    found.push(if on_path(&builder) || builder.contains('$') {
        check("builder", Status::Ok, config.builder.clone())
    } else {
        check(
            "builder",
            Status::Warn,
            format!(
                "`{builder}` is not on PATH; `build` nodes will fail (set `builder` in kavi.toml)"
            ),
        )
    });
    found.push(match crate::confinement::runtime::bwrap() {
        Ok(bwrap) => check(
            "confinement",
            Status::Ok,
            format!(
                "{}: builders, gates and skills run in namespaces of their own \
                 (policies/confinement.toml); bounds by {}; a forbidden system call fails the \
                 run {}",
                bwrap.display(),
                crate::confinement::bounds::cgroup_support().describe(),
                match crate::confinement::deaths::availability() {
                    Ok(()) => "whichever process of it makes it".to_owned(),
                    Err(why) => format!("only when the program itself makes it ({why})"),
                }
            ),
        ),
        Err(missing) => check(
            "confinement",
            Status::Warn,
            format!(
                "{missing}: roles with `require = true` in policies/confinement.toml will \
                 refuse to run"
            ),
        ),
    });
    found.push(if on_path("python3") {
        check(
            "python3",
            Status::Ok,
            "the shipped gate set and example skills run",
        )
    } else {
        check(
            "python3",
            Status::Fail,
            "not on PATH: the shipped gate set and example skills need it",
        )
    });

    found.extend(toolchain_checks(workspace));

    match super::skills::rehash_trusted(workspace, None) {
        Ok(results) => {
            let drifted: Vec<&str> = results
                .iter()
                .filter(|r| r["drifted"] == true)
                .filter_map(|r| r["skill"].as_str())
                .collect();
            found.push(if drifted.is_empty() {
                check(
                    "trusted skills",
                    Status::Ok,
                    format!("{} trusted, none drifted", results.len()),
                )
            } else {
                check(
                    "trusted skills",
                    Status::Fail,
                    format!("drifted since promotion: {}", drifted.join(", ")),
                )
            });
        }
        Err(e) => found.push(check("trusted skills", Status::Fail, e.to_string())),
    }

    let gateway = &config.gateway;
    found.push(if gateway.base_url.is_empty() {
        check("gateway", Status::Ok, "none configured: no advisory")
    } else {
        let allowed = crate::policy::read(&workspace.root, network::DEFAULT_POLICY)
            .map_err(|e| e.to_string())
            .and_then(|source| NetworkPolicy::parse(&source).map_err(|d| d.to_string()))
            .and_then(|policy| policy.check(&gateway.base_url).map(|_| ()));
        let key = std::env::var_os(&gateway.api_key_env).is_some();
        match allowed {
            Err(e) => check("gateway", Status::Fail, e),
            Ok(()) if !key => check(
                "gateway",
                Status::Warn,
                format!(
                    "{} (no API key in {})",
                    gateway.base_url, gateway.api_key_env
                ),
            ),
            Ok(()) => check("gateway", Status::Ok, gateway.base_url.clone()),
        }
    });
    found
}

/// The ledger's own checks: it opens and lists its runs, its journal chains and matches the
/// tables, and what is left of sandboxes.
fn ledger_checks(workspace: &Workspace) -> Vec<Check> {
    let config = &workspace.config;
    let mut found = vec![match Ledger::open_existing(&config.ledger) {
        Ok(ledger) => match ledger.list_runs(usize::MAX) {
            Ok(runs) => check(
                "ledger",
                Status::Ok,
                format!(
                    "{} ({} runs)",
                    crate::ledger::display_location(&config.ledger),
                    runs.len()
                ),
            ),
            Err(e) => check("ledger", Status::Fail, e.to_string()),
        },
        Err(e) => check("ledger", Status::Fail, e.to_string()),
    }];
    found.push(match super::ledger::findings(workspace) {
        Err(e) => check("journal", Status::Fail, e.to_string()),
        Ok((findings, _)) => match findings.problems.first() {
            None => check(
                "journal",
                Status::Ok,
                format!(
                    "{} entries chain and match the tables ({} checkpoints)",
                    findings.entries, findings.checkpoints
                ),
            ),
            Some(first) => check(
                "journal",
                Status::Fail,
                format!(
                    "{first} ({} problems; `kavi ledger verify` lists them)",
                    findings.problems.len()
                ),
            ),
        },
    });
    found.push(sandboxes_check(workspace));
    found
}

/// The artifact store takes new files.
fn artifacts_check(workspace: &Workspace) -> Check {
    let config = &workspace.config;
    match ArtifactStore::open(&config.artifacts) {
        Ok(store) => match tempfile::NamedTempFile::new_in(store.temp_dir()) {
            Ok(_) => check(
                "artifacts",
                Status::Ok,
                config.artifacts.display().to_string(),
            ),
            Err(e) => check("artifacts", Status::Fail, format!("not writable: {e}")),
        },
        Err(e) => check("artifacts", Status::Fail, e.to_string()),
    }
}

/// What is left of sandboxes: kept after runs that did not succeed (normal until their time is
/// up), or folders kavi failed to remove.
fn sandboxes_check(workspace: &Workspace) -> Check {
    let root = workspace.config.sandboxes.display();
    let remaining = match Ledger::open_existing(&workspace.config.ledger)
        .and_then(|ledger| ledger.remaining_sandboxes())
    {
        Ok(remaining) => remaining,
        Err(e) => return check("sandboxes", Status::Fail, e.to_string()),
    };
    if let Some(stuck) = remaining.iter().find_map(|s| s.error.as_deref()) {
        return check(
            "sandboxes",
            Status::Warn,
            format!("{} left in {root}; {stuck}", remaining.len()),
        );
    }
    match remaining
        .iter()
        .filter_map(|s| s.keep_until.as_deref())
        .max()
    {
        None if remaining.is_empty() => {
            check("sandboxes", Status::Ok, format!("none left in {root}"))
        }
        None => check(
            "sandboxes",
            Status::Ok,
            format!("{} in use by running runs, in {root}", remaining.len()),
        ),
        Some(until) => check(
            "sandboxes",
            Status::Ok,
            format!(
                "{} kept after runs that did not succeed, in {root}, until {until} at the latest \
                 (removed by the next `kavi pipeline run` after that)",
                remaining.len()
            ),
        ),
    }
}

pub fn run(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let found = checks(workspace);
    let failed = found.iter().any(|c| c.status == Status::Fail);
    if json {
        super::print_json(&found);
    } else {
        let rows: Vec<Vec<String>> = found
            .iter()
            .map(|c| {
                let mark = match c.status {
                    Status::Ok => "ok",
                    Status::Warn => "warn",
                    Status::Fail => "FAIL",
                };
                vec![mark.to_owned(), c.check.clone(), c.detail.clone()]
            })
            .collect();
        out!("{}", table(&rows));
    }
    Ok(if failed {
        exit::RUN_FAILED
    } else {
        exit::SUCCESS
    })
}

/// Each declared toolchain: provisioned, named in kavi.toml, or still to be made (a warning: the
/// first run that needs it makes it). A workspace that declares none has nothing to check.
fn toolchain_checks(workspace: &Workspace) -> Vec<Check> {
    if !workspace
        .root
        .join(crate::toolchains::DEFAULT_POLICY)
        .exists()
    {
        return Vec::new();
    }
    let set = match super::toolchain::load(workspace) {
        Ok(set) => set,
        Err(e) => return vec![check("toolchains", Status::Fail, e.to_string())],
    };
    let home = crate::config::ToolchainHome::of(workspace);
    set.toolchains
        .iter()
        .map(|toolchain| {
            let name = format!("toolchain {}", toolchain.name);
            if let Some(path) = toolchain.existing_in(&home) {
                return check(
                    &name,
                    Status::Ok,
                    format!(
                        "kavi.toml names {}; a run checks its versions",
                        path.display()
                    ),
                );
            }
            match super::toolchain::installed_state(toolchain, &home) {
                super::toolchain::Installed::Found(path, Ok(_)) => check(
                    &name,
                    Status::Ok,
                    format!(
                        "{} at {}, as kavi installed it",
                        toolchain.describe_pins(),
                        path.display()
                    ),
                ),
                super::toolchain::Installed::Found(path, Err(why)) => check(
                    &name,
                    Status::Warn,
                    format!(
                        "{} is not the environment kavi installed ({why}): the next run that needs \
                         it provisions it again",
                        path.display()
                    ),
                ),
                super::toolchain::Installed::Unknown(why) => check(&name, Status::Fail, why),
                super::toolchain::Installed::Missing => check(
                    &name,
                    Status::Warn,
                    format!(
                        "not provisioned yet ({}): the first run that needs it installs it, or \
                         `kavi toolchain install`",
                        toolchain.describe_pins()
                    ),
                ),
            }
        })
        .collect()
}
