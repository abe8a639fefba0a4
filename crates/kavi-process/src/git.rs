//! The one place kavi builds git commands.
//!
//! kavi runs git only in folders it has just made (a sandbox's baseline), but a folder's `.git`
//! is data the builder can edit, and git executes what its configuration names: hooks,
//! `core.fsmonitor`, `core.sshCommand`, diff and filter drivers. So every call here names its git
//! dir and work tree explicitly (no discovery, no `core.worktree`), reads no system, global or
//! user configuration, and overrides on the command line (which wins over any file) every key
//! that would run a program. The environment is built from nothing: no `GIT_*` variable of the
//! caller's reaches git.

use std::path::Path;

use tokio_util::sync::CancellationToken;

use crate::{CaptureOptions, CommandSpec, Exit};

/// Configuration given on the command line, which takes precedence over every config file.
/// Each entry turns off something that would make git run a program or read outside the repo.
const SAFE_CONFIG: &[&str] = &[
    "core.hooksPath=/dev/null",
    "core.fsmonitor=false",
    "core.untrackedCache=false",
    "core.attributesFile=/dev/null",
    "core.excludesFile=/dev/null",
    "core.sshCommand=false",
    "core.pager=cat",
    "core.editor=false",
    "core.askPass=",
    "core.quotepath=off",
    "credential.helper=",
    "gpg.program=false",
    "commit.gpgsign=false",
    "tag.gpgsign=false",
    "protocol.allow=never",
    "user.name=kavi",
    "user.email=kavi@localhost",
];

/// The id of the empty tree, which every SHA-1 repository knows without storing it.
const EMPTY_TREE: &str = "4b825dc642cb6eb9a060e54bf8d69288fbee4904";

/// How much of git's output is kept in memory; kavi asks git only for short answers.
const OUTPUT_LIMIT: usize = 1024 * 1024;

/// The argv and environment of one git call on the repository whose work tree is `work_tree`
/// and whose git dir is `work_tree/.git`.
pub fn command(work_tree: &Path, args: &[&str]) -> CommandSpec {
    let git_dir = work_tree.join(".git");
    let mut argv: Vec<String> = Vec::with_capacity(SAFE_CONFIG.len() * 2 + args.len() + 4);
    for setting in SAFE_CONFIG {
        argv.push("-c".into());
        argv.push((*setting).into());
    }
    argv.push(format!("--git-dir={}", git_dir.display()));
    argv.push(format!("--work-tree={}", work_tree.display()));
    argv.push("--no-pager".into());
    argv.extend(args.iter().map(|a| (*a).to_owned()));
    // `diff.external` cannot be emptied by `-c`; these flags switch it off where it applies.
    if matches!(args.first(), Some(&("diff" | "log" | "show"))) {
        argv.insert(argv.len() - args.len() + 1, "--no-ext-diff".into());
        argv.insert(argv.len() - args.len() + 1, "--no-textconv".into());
    }
    CommandSpec {
        program: "git".into(),
        args: argv,
        env: vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            // A HOME with no .gitconfig in it, and no XDG config either.
            ("HOME".into(), "/nonexistent".into()),
            ("XDG_CONFIG_HOME".into(), "/nonexistent".into()),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
            ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
            ("GIT_ATTR_NOSYSTEM".into(), "1".into()),
            // Attributes come from the empty tree, not the work tree's `.gitattributes`: no
            // filter or diff driver the tree names is ever looked up.
            ("GIT_ATTR_SOURCE".into(), EMPTY_TREE.into()),
            ("GIT_TERMINAL_PROMPT".into(), "0".into()),
            ("GIT_OPTIONAL_LOCKS".into(), "0".into()),
            ("LC_ALL".into(), "C".into()),
        ],
        cwd: work_tree.to_owned(),
        stdin: None,
        confinement: None,
    }
}

/// Runs one git call (see [`command`]) and returns its standard output.
pub async fn run(work_tree: &Path, args: &[&str]) -> Result<String, String> {
    let spec = command(work_tree, args);
    let options = CaptureOptions {
        limit: OUTPUT_LIMIT,
        spill_dir: std::env::temp_dir(),
        roster: None,
        live: None,
    };
    let finished = crate::run(&spec, &options, &CancellationToken::new())
        .await
        .map_err(|e| format!("failed to run git: {e}"))?;
    match finished.exit {
        Exit::Code(0) => Ok(String::from_utf8_lossy(&finished.stdout.head).into_owned()),
        _ => Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&finished.stderr.head).trim()
        )),
    }
}

/// Starts a repository in `dir` and commits everything in it; returns the baseline commit.
///
/// The repository is a convenience for the builder (it can ask git what it changed); kavi's own
/// record of the baseline is the manifest in the ledger.
pub async fn init_baseline(dir: &Path) -> Result<String, String> {
    // An empty template: no sample hooks, nothing from the machine's git installation.
    run(dir, &["init", "-q", "--template=", "-b", "baseline"]).await?;
    // --force: the baseline holds every copied file, even ones the tree's .gitignore names.
    run(dir, &["add", "--all", "--force"]).await?;
    run(
        dir,
        &[
            "commit",
            "-q",
            "--no-verify",
            "--allow-empty",
            "-m",
            "kavi baseline",
        ],
    )
    .await?;
    Ok(run(dir, &["rev-parse", "HEAD"]).await?.trim().to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A repository whose own configuration asks git to run a command on every status, add and
    /// commit, and whose hooks do the same: none of it may run under kavi's git.
    #[tokio::test]
    async fn configuration_in_the_repository_runs_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let repo = dir.path().join("repo");
        std::fs::create_dir(&repo).unwrap();
        std::fs::write(repo.join("a.txt"), "a\n").unwrap();
        init_baseline(&repo).await.unwrap();
        let marker = dir.path().join("PWNED");
        let touch = format!("touch {}", marker.display());
        let config = repo.join(".git/config");
        let mut text = std::fs::read_to_string(&config).unwrap();
        text.push_str(&format!(
            "[core]\n\tfsmonitor = \"{touch}; false\"\n\thooksPath = hooks\n\tworktree = /\n\
             [diff]\n\texternal = \"{touch}\"\n\
             [filter \"x\"]\n\tclean = \"{touch}\"\n\tsmudge = \"{touch}\"\n"
        ));
        std::fs::write(&config, text).unwrap();
        std::fs::write(repo.join(".gitattributes"), "* filter=x diff=x\n").unwrap();
        std::fs::create_dir(repo.join(".git/hooks")).unwrap();
        for hook in [
            "pre-commit",
            "post-commit",
            "commit-msg",
            "post-index-change",
        ] {
            let path = repo.join(".git/hooks").join(hook);
            std::fs::write(&path, format!("#!/bin/sh\n{touch}\n")).unwrap();
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        std::fs::write(repo.join("a.txt"), "b\n").unwrap();

        run(&repo, &["status", "--porcelain"]).await.unwrap();
        run(&repo, &["diff", "HEAD"]).await.unwrap();
        run(&repo, &["add", "--all"]).await.unwrap();
        run(&repo, &["commit", "-q", "-m", "second"]).await.unwrap();
        assert!(
            !marker.exists(),
            "git ran a command from the repository's configuration"
        );
    }

    #[test]
    fn every_call_names_its_git_dir_and_reads_no_outside_config() {
        let spec = command(Path::new("/sandbox"), &["status"]);
        assert!(spec.args.contains(&"--git-dir=/sandbox/.git".to_owned()));
        assert!(spec.args.contains(&"--work-tree=/sandbox".to_owned()));
        assert!(spec.args.contains(&"core.fsmonitor=false".to_owned()));
        assert_eq!(spec.args.last().unwrap(), "status");
        let env: std::collections::HashMap<_, _> = spec.env.into_iter().collect();
        assert_eq!(env["GIT_CONFIG_NOSYSTEM"], "1");
        assert_eq!(env["GIT_CONFIG_GLOBAL"], "/dev/null");
        assert!(!env.contains_key("GIT_DIR"));
    }
}
