//! `kavi skill propose|show|list|run|verify|restore|revoke|attest|export|import|verify-attestation`; the governed operations' logic is
//! kavi_governance::skills'.

use crate::confinement::policy::ConfinementPolicy;
use serde_json::json;

use super::output::{short_hash, table};
use crate::config::Workspace;
use crate::error::{Error, exit};
use tokio_util::sync::CancellationToken;

use crate::executions::{Lineage, Runner, pool};
use crate::ledger::{ArtifactStore, ExecutionRecord, Ledger, LedgerError, Owner};
use crate::policy::adoption::RunRules;
use crate::skills::trust::TrustPolicy;
use crate::skills::{Proposal, SideEffects, TRUSTED};
use crate::template::TemplateEngine;
use kavi_governance::skills::{self as governed, trusted_under};

const LIFECYCLE: &str = crate::skills::LIFECYCLE_POLICY;

pub(super) use kavi_governance::skills::rehash_trusted;

pub fn propose(workspace: &Workspace, file: &str, json: bool) -> Result<i32, Error> {
    let governed::ProposedSkill {
        proposed,
        initial,
        skill,
    } = governed::propose(workspace, file)?;
    let name = proposed.proposal.name.get_ref();
    if json {
        super::print_json(&skill);
    } else if proposed.created && proposed.version > 1 {
        outln!(
            "proposed version {} of `{name}` ({}): {}, spec {}; version {} stays trusted and runs \
             until this one is promoted",
            proposed.version,
            proposed.proposal.side_effect,
            skill.state,
            short_hash(&proposed.spec.sha256),
            skill.trusted_version.unwrap_or_default()
        );
    } else if proposed.created {
        outln!(
            "proposed skill `{name}` ({}): {initial}, spec {}",
            proposed.proposal.side_effect,
            short_hash(&proposed.spec.sha256)
        );
    } else {
        outln!(
            "skill `{name}` was proposed from this text already (spec {}); nothing changed",
            short_hash(&proposed.spec.sha256)
        );
    }
    Ok(exit::SUCCESS)
}

pub fn show(workspace: &Workspace, name: &str, json: bool) -> Result<i32, Error> {
    let ledger = Ledger::open_existing(&workspace.config.ledger)?;
    let skill = ledger.skill(name)?;
    let transitions = ledger.skill_transitions(name)?;
    // What its latest verification's tools were installed from: the locked sets, by hash.
    let toolchains = ledger.latest_toolchains(name)?;
    if json {
        let value = json!({ "skill": skill, "transitions": transitions, "toolchains": toolchains });
        super::print_json(&value);
        return Ok(exit::SUCCESS);
    }
    outln!("skill {}: {}", skill.name, skill.state);
    outln!("  {}", skill.description);
    outln!("  version      {}", skill.version);
    if let Some(trusted) = skill.trusted_version
        && let Some(hash) = &skill.trusted_hash
    {
        outln!(
            "  trusted      version {trusted} at {}, under {}",
            short_hash(hash),
            trusted_under(&skill)
        );
    }
    outln!("  side effect  {}", skill.side_effect);
    outln!("  spec         sha256:{}", skill.spec_artifact);
    for toolchain in &toolchains {
        outln!(
            "  toolchain    {} lock {}",
            toolchain["toolchain"].as_str().unwrap_or_default(),
            toolchain["lock"]
                .as_str()
                .unwrap_or("- (an environment kavi.toml names)")
        );
    }
    outln!();
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
    out!("{}", table(&rows));
    Ok(exit::SUCCESS)
}

/// Re-hashes trusted skills and reports drift; a drifted skill moves to the lifecycle's
/// `drifted` state (SUSPENDED), so it neither runs nor is listed until restored or rebuilt.
/// Exit 1 when any skill drifted.
pub fn verify(workspace: &Workspace, name: Option<&str>, json: bool) -> Result<i32, Error> {
    let governed::Verified {
        results,
        drifted,
        lifecycle,
    } = governed::verify(workspace, name)?;
    if json {
        super::print_json(&results);
    } else if results.is_empty() {
        outln!("no trusted skills");
    } else {
        for r in &results {
            let name = r["skill"].as_str().unwrap_or_default();
            let trusted = short_hash(r["trusted_hash"].as_str().unwrap_or_default());
            match (
                r["drifted"] == true,
                r["current_hash"].as_str(),
                r["error"].as_str(),
            ) {
                (false, _, _) if r["stale_here"] == true => outln!(
                    "STALE  {name}  trusted {trusted}; this checkout's files differ ({}): it runs \
                     from the trusted files in the shared store, and stays trusted for the team; \
                     update the checkout, or `kavi skill restore {name}`",
                    r["evidence"]
                        .as_str()
                        .or(r["error"].as_str())
                        .unwrap_or("the same bytes, another mode")
                ),
                (false, _, _) => outln!("ok     {name}  {trusted}"),
                (true, Some(_), Some(reason)) => {
                    outln!("DRIFT  {name}  trusted {trusted}, same bytes, but {reason}")
                }
                (true, Some(now), None) => {
                    outln!("DRIFT  {name}  trusted {trusted}, now {}", short_hash(now))
                }
                (true, None, error) => outln!(
                    "DRIFT  {name}  trusted {trusted}, now unreadable: {}",
                    error.unwrap_or_default()
                ),
            }
        }
        if let Some(lifecycle) = &lifecycle {
            let what = match &lifecycle.drifted {
                Some(state) => format!("they are now {state} and do not run"),
                None => format!("they will not run ({LIFECYCLE} declares no `drifted` state)"),
            };
            outln!(
                "{drifted} of {} trusted skills changed since promotion; {what}. \
                 `kavi skill restore NAME` puts the trusted files back, or the forge builds it again",
                results.len()
            );
        }
    }
    Ok(if drifted > 0 {
        exit::RUN_FAILED
    } else {
        exit::SUCCESS
    })
}

/// Puts a skill's trusted files back, byte for byte as they were promoted, and (when it was
/// suspended for drift) returns it to TRUSTED.
pub fn restore(workspace: &Workspace, name: &str, comment: Option<&str>) -> Result<i32, Error> {
    let trusted_hash = governed::restore(workspace, name, comment)?;
    outln!(
        "restored `{name}`: its files are those trusted at {}; it is {TRUSTED}",
        short_hash(&trusted_hash)
    );
    Ok(exit::SUCCESS)
}

/// Revokes a skill: it moves to the lifecycle's `revoked` state and no version of it runs again.
pub fn revoke(workspace: &Workspace, name: &str, comment: &str) -> Result<i32, Error> {
    let revoked = governed::revoke(workspace, name, comment)?;
    outln!("revoked `{name}`: it is {revoked} and does not run");
    Ok(exit::SUCCESS)
}

/// Prints (or writes to `output`) the attestation of a skill's promotion.
pub fn attest(
    workspace: &Workspace,
    name: &str,
    version: Option<i64>,
    output: Option<&std::path::Path>,
) -> Result<i32, Error> {
    let envelope = governed::attest(workspace, name, version)?;
    match output {
        None => outln!("{envelope}"),
        Some(path) => {
            std::fs::write(path, format!("{envelope}\n")).map_err(|source| Error::Io {
                context: format!("failed to write {}", path.display()),
                source,
            })?;
            errln!("wrote the attestation of `{name}` to {}", path.display());
        }
    }
    Ok(exit::SUCCESS)
}

/// Prints (or writes to `output`) a bundle of a trusted skill.
pub fn export(
    workspace: &Workspace,
    name: &str,
    output: Option<&std::path::Path>,
) -> Result<i32, Error> {
    let bundle = governed::export(workspace, name)?;
    match output {
        None => outln!("{bundle}"),
        Some(path) => {
            std::fs::write(path, format!("{bundle}\n")).map_err(|source| Error::Io {
                context: format!("failed to write {}", path.display()),
                source,
            })?;
            errln!("wrote a bundle of `{name}` to {}", path.display());
        }
    }
    Ok(exit::SUCCESS)
}

/// Checks an attestation's signature under `key`, its statement, and (with `files`) the files
/// it names: exit 1, with what failed, when a check fails.
pub fn verify_attestation(
    file: &std::path::Path,
    key: &str,
    files: Option<&std::path::Path>,
    json: bool,
) -> Result<i32, Error> {
    // An attestation of a skill's files is kilobytes; a key, 64 digits.
    const LIMIT: u64 = 16 << 20;
    let read = |path: &std::path::Path| {
        std::fs::File::open(path)
            .and_then(|file| crate::sandbox::read_bounded(file, LIMIT))
            .map(|bytes| String::from_utf8_lossy(&bytes).into_owned())
            .map_err(|source| Error::Io {
                context: format!("failed to read {}", path.display()),
                source,
            })
    };
    let envelope = read(file)?;
    let key_text = match std::path::Path::new(key) {
        path if crate::ledger::checkpoint::parse_public(key).is_none() && path.is_file() => {
            // The signing key's file looks like a public key (64 hex digits) and is not one:
            // its digits must never be printed back, so it is refused by name.
            let signing = crate::ledger::keys::signing_key();
            let same = |a: &std::path::Path, b: &std::path::Path| {
                a.canonicalize()
                    .ok()
                    .is_some_and(|a| b.canonicalize().ok() == Some(a))
            };
            if same(path, &signing) {
                return Err(Error::Usage(format!(
                    "{key} is kavi's private signing key; give the public key, as `kavi ledger \
                     keygen` printed it"
                )));
            }
            read(path)?
        }
        _ => key.to_owned(),
    };
    let key = crate::ledger::checkpoint::parse_public(key_text.trim()).ok_or_else(|| {
        Error::Usage(format!(
            "`{key}` is neither a public key (64 hex digits) nor a file holding one"
        ))
    })?;
    let statement = match kavi_provenance::verify(&envelope, &key) {
        Ok(statement) => statement,
        Err(refused) => {
            if json {
                super::print_json(&json!({ "verified": false, "error": refused.to_string() }));
            } else {
                errln!("not verified: {refused}");
            }
            return Ok(exit::RUN_FAILED);
        }
    };
    let changed = match files {
        None => None,
        Some(root) => Some(
            kavi_provenance::changed_subjects(&statement, |name| {
                if let Some(reason) = crate::sandbox::unsafe_path_reason(name) {
                    return Err(std::io::Error::other(format!(
                        "not a path kavi reads: {reason}"
                    )));
                }
                // No link followed: a file outside DIR is never what a subject names. One
                // that is missing or unreadable is not the attested file: it counts as changed.
                Ok(crate::sandbox::open_beneath(root, name)
                    .and_then(|file| crate::sandbox::read_bounded(file, LIMIT << 6))
                    .unwrap_or_default())
            })
            .map_err(|reason| Error::Usage(format!("cannot check the attested files: {reason}")))?,
        ),
    };
    let ok = changed.as_ref().is_none_or(Vec::is_empty);
    let parameters = &statement["predicate"]["buildDefinition"]["externalParameters"];
    let subjects = statement["subject"].as_array().map_or(0, Vec::len);
    if json {
        super::print_json(&json!({
            "verified": ok,
            "key": kavi_provenance::key_id(&key),
            "statement": statement,
            "changed": changed,
        }));
    } else {
        outln!(
            "signature: verifies under key {}",
            crate::ledger::checkpoint::short(&kavi_provenance::key_id(&key))
        );
        outln!(
            "statement: in-toto v1 with SLSA provenance v1: skill `{}` version {} at {}, promoted \
             by {}",
            parameters["skill"].as_str().unwrap_or("?"),
            parameters["version"],
            parameters["sourceHash"].as_str().unwrap_or("?"),
            statement["predicate"]["buildDefinition"]["internalParameters"]["promotedBy"]
                .as_str()
                .unwrap_or("?"),
        );
        match &changed {
            None => outln!("files: {subjects} attested; not compared (give --files DIR)"),
            Some(changed) if changed.is_empty() => {
                outln!("files: all {subjects} match their attested digests")
            }
            Some(changed) => outln!("files: changed since attested: {}", changed.join(", ")),
        }
    }
    Ok(if ok { exit::SUCCESS } else { exit::RUN_FAILED })
}

/// What running skills needs, loaded once for a command.
pub(super) struct SkillEnv {
    pub store: ArtifactStore,
    pub templates: TemplateEngine,
    pub trust: TrustPolicy,
    pub timeout: std::time::Duration,
    pub confinement: ConfinementPolicy,
    pub owner: Owner,
    pub kavi_state: Vec<std::path::PathBuf>,
    /// The rules these policies were read from; `kavi mcp` and `kavi chat` read theirs here.
    pub rules: RunRules,
}

impl SkillEnv {
    pub fn load(workspace: &Workspace) -> Result<Self, Error> {
        Self::load_with(workspace, kavi_governance::run_rules(workspace)?)
    }

    /// [`SkillEnv::load`] under `rules`, read by the caller (on a ledger it holds open).
    fn load_with(workspace: &Workspace, rules: RunRules) -> Result<Self, Error> {
        let store = super::open_store(workspace)?;
        let templates = TemplateEngine::new(&workspace.templates_dir());
        let (trust, confinement) = Self::parse(&rules, &templates)?;
        if let Some(warning) = weakening_warning(&rules) {
            errln!("{warning}");
        }
        let timeout = workspace.config.skill_timeout().map_err(Error::Usage)?;
        let owner =
            Owner::claim(&workspace.config.ledger, &store.temp_dir()).map_err(|source| {
                Error::Io {
                    context: "failed to claim a lock beside the ledger".into(),
                    source,
                }
            })?;
        Ok(Self {
            store,
            templates,
            trust,
            timeout,
            confinement,
            owner,
            kavi_state: workspace.state_paths(),
            rules,
        })
    }

    /// The trust and confinement policies of `rules`: a function of their texts alone.
    fn parse(
        rules: &RunRules,
        templates: &TemplateEngine,
    ) -> Result<(TrustPolicy, ConfinementPolicy), Error> {
        let trust = kavi_governance::run_trust(rules, templates)?;
        let confinement = super::read_confinement(templates, |path| Ok(rules.source(path)))?;
        Ok((trust, confinement))
    }

    /// The rules skills run under now, read again on `ledger` (a resident executor's own
    /// connection): each run is governed by the rules as they are at its run, the adopted
    /// copies where the disk weakens them (see [`kavi_governance::run_rules`]). The policies
    /// are parsed again only when the texts that govern are not, byte for byte, the ones they
    /// were parsed from: an edit on disk, the disk weakening or no longer weakening the
    /// adopted set, a new adoption. The templates are made new each time, so a template file
    /// is read as a direct run reads it.
    pub fn reload(&mut self, workspace: &Workspace, ledger: &Ledger) -> Result<(), Error> {
        self.templates = TemplateEngine::new(&workspace.templates_dir());
        let rules = crate::policy::adoption::for_run(Some(ledger), &workspace.root)
            .map_err(Error::Usage)?;
        if rules.files != self.rules.files {
            (self.trust, self.confinement) = Self::parse(&rules, &self.templates)?;
        }
        self.rules = rules;
        Ok(())
    }

    /// A runner that logs to the configured JSONL log unless `log` is false.
    pub fn runner<'a>(&'a self, workspace: &'a Workspace, log: bool) -> Runner<'a> {
        Runner {
            root: &workspace.root,
            ledger: &workspace.config.ledger,
            held: None,
            // A running executor records and logs every run it serves: a runner told not to
            // log runs its skills itself.
            pool: log,
            artifacts: &self.store,
            templates: &self.templates,
            trust: &self.trust,
            log: log.then_some(workspace.config.executions_log.as_path()),
            timeout: self.timeout,
            confinement: &self.confinement,
            owner: &self.owner,
            kavi_state: &self.kavi_state,
            deferred: None,
        }
    }
}

/// The warning a command that runs skills gives when the governing files weaken the adopted
/// rules, which then govern in their place; `None` when the files on disk govern.
pub(super) fn weakening_warning(rules: &RunRules) -> Option<String> {
    (!rules.ignored.is_empty()).then(|| {
        format!(
            "warning: the governing files weaken the adopted rules ({}): running under {}; \
             propose them with `kavi policy propose`",
            rules.ignored.join("; "),
            rules.describe()
        )
    })
}

/// Refuses a side effect that nobody confirmed: `--yes`, or a yes at the terminal prompt.
pub(super) fn require_confirmation(name: &str, class: SideEffects, yes: bool) -> Result<(), Error> {
    if class.is_read_only() || yes || confirm(name, class)? {
        return Ok(());
    }
    Err(Error::Usage(format!(
        "`{name}` is {class}: confirm with --yes (or answer the prompt on a terminal); nothing was run"
    )))
}

/// Prints an execution record and maps it to an exit code: 0 when the skill succeeded, 130 when
/// Ctrl-C stopped it.
pub(super) fn report(record: &ExecutionRecord, cancel: &CancellationToken) -> i32 {
    super::print_json(record);
    if record.success {
        exit::SUCCESS
    } else if cancel.is_cancelled() {
        super::cancelled_exit_code()
    } else {
        errln!(
            "error: `{}` failed: {}",
            record.skill,
            record.error.as_deref().unwrap_or("unknown")
        );
        exit::RUN_FAILED
    }
}

/// Runs a trusted skill: re-hash first and refuse on drift, confirm side effects, validate the
/// input and output against the schemas, and print the execution record.
pub async fn run(workspace: &Workspace, name: &str, input: &str, yes: bool) -> Result<i32, Error> {
    let input: serde_json::Value = serde_json::from_str(input)
        .map_err(|e| Error::Usage(format!("--input is not valid JSON: {e}")))?;
    // A running executor runs a READ_ONLY skill in a sandbox it started ahead, and records it:
    // asked before anything is read here, as it does the trust check itself, under the rules
    // that govern now (it says when the adopted ones govern in place of the files). Ctrl-C
    // ends this process, which closes the connection: the executor then cancels the run and
    // records it.
    let timeout = workspace.config.skill_timeout().map_err(Error::Usage)?;
    let request = pool::Request {
        caller: pool::Caller::new(
            &workspace.root,
            timeout,
            Some(&workspace.config.executions_log),
        ),
        skill: name.to_owned(),
        input: input.clone(),
        lineage: Lineage::default(),
        hash: None,
    };
    let uncancelled = CancellationToken::new();
    match pool::ask(&workspace.config.ledger, &request, &uncancelled).await {
        pool::Answer::Ran(reply) => {
            if let Some(warning) = &reply.warning {
                errln!("{warning}");
            }
            return Ok(report(&reply.record, &uncancelled));
        }
        pool::Answer::Unvouched(reason) => errln!("warning: {reason}; running the skill here"),
        pool::Answer::Unserved => {}
    }
    // A skill that does not exist is said so before policies are read or anything is made.
    let ledger = match Ledger::open_existing_to_write(&workspace.config.ledger) {
        Err(LedgerError::Missing(_)) => {
            return Err(Error::NotFound(format!(
                "no skill `{name}`: nothing has been recorded in this workspace yet"
            )));
        }
        ledger => ledger?,
    };
    drop(ledger.skill(name)?);
    // One connection for the rules, the trust check and the records: each opening reads the
    // schema and looks for dead owners to recover.
    let rules =
        crate::policy::adoption::for_run(Some(&ledger), &workspace.root).map_err(Error::Usage)?;
    let env = SkillEnv::load_with(workspace, rules)?;
    let ledger = std::sync::Mutex::new(ledger);
    // The executor was asked above: it declined, or none answered.
    let runner = env.runner(workspace, true).holding(&ledger);
    let ready = runner.ready(name)?;
    require_confirmation(name, ready.proposal.side_effect, yes)?;
    let cancel = super::cancel_on_signals("the skill");
    let record = runner
        .run(&ready, input, &Lineage::default(), &cancel)
        .await?;
    Ok(report(&record, &cancel))
}

/// Lists trusted skills with what a caller needs: description, side effect, secrets, schemas.
pub fn list(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let mut listed = Vec::new();
    // No ledger is no skills: listing must not make one.
    match Ledger::open_existing(&workspace.config.ledger) {
        Err(LedgerError::Missing(_)) => {}
        ledger => {
            let ledger = ledger?;
            let store = super::open_store(workspace)?;
            for trusted in ledger.trusted_skills(TRUSTED)? {
                let proposal =
                    Proposal::from_artifact(&store, &trusted.spec_artifact).map_err(|e| {
                        Error::Io {
                            context: format!("failed to read the proposal of `{}`", trusted.name),
                            source: std::io::Error::other(e),
                        }
                    })?;
                listed.push(json!({
                    "name": trusted.name,
                    "version": trusted.version,
                    "description": proposal.description,
                    "side_effect": proposal.side_effect,
                    "secrets": proposal.secrets,
                    "input_schema": proposal.input_schema,
                    "output_schema": proposal.output_schema,
                    "trusted_hash": trusted.trusted_hash,
                }));
            }
        }
    }
    if json {
        super::print_json(&listed);
        return Ok(exit::SUCCESS);
    }
    if listed.is_empty() {
        outln!(
            "no trusted skills yet; the forge makes them: kavi pipeline run forge.toml --set skill=NAME"
        );
        return Ok(exit::SUCCESS);
    }
    let mut rows = vec![
        ["SKILL", "SIDE EFFECT", "SECRETS", "INPUT", "DESCRIPTION"]
            .map(String::from)
            .to_vec(),
    ];
    for skill in &listed {
        let secrets: Vec<&str> = skill["secrets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s.as_str())
            .collect();
        let fields: Vec<&str> = skill["input_schema"]["properties"]
            .as_object()
            .map(|p| p.keys().map(String::as_str).collect())
            .unwrap_or_default();
        rows.push(vec![
            skill["name"].as_str().unwrap_or_default().to_owned(),
            skill["side_effect"].as_str().unwrap_or_default().to_owned(),
            if secrets.is_empty() {
                "-".into()
            } else {
                secrets.join(", ")
            },
            if fields.is_empty() {
                "-".into()
            } else {
                fields.join(", ")
            },
            skill["description"].as_str().unwrap_or_default().to_owned(),
        ]);
    }
    out!("{}", table(&rows));
    Ok(exit::SUCCESS)
}

/// Asks on the terminal; without one there is nobody to ask, so the answer is no.
pub(super) fn confirm(name: &str, class: SideEffects) -> Result<bool, Error> {
    use std::io::{BufRead, IsTerminal, Write};
    if !std::io::stdin().is_terminal() {
        return Ok(false);
    }
    eprint!("`{name}` is {class}. Run it? [y/N] ");
    let _ = std::io::stderr().flush();
    let mut answer = String::new();
    std::io::stdin()
        .lock()
        .read_line(&mut answer)
        .map_err(|source| Error::Io {
            context: "failed to read the answer".into(),
            source,
        })?;
    Ok(matches!(answer.trim(), "y" | "Y" | "yes"))
}
