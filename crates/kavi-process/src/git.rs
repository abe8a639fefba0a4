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
    command_in(&work_tree.join(".git"), work_tree, args)
}

/// [`command`] with the git dir named apart from the work tree.
fn command_in(git_dir: &Path, work_tree: &Path, args: &[&str]) -> CommandSpec {
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
    let out = run_spec(&command(work_tree, args), args, OUTPUT_LIMIT).await?;
    Ok(String::from_utf8_lossy(&out).into_owned())
}

/// Runs `spec` (the git call `args`) and returns its standard output, refusing one longer than
/// `limit`.
async fn run_spec(spec: &CommandSpec, args: &[&str], limit: usize) -> Result<Vec<u8>, String> {
    let options = CaptureOptions {
        limit,
        spill_dir: std::env::temp_dir(),
        roster: None,
        live: None,
    };
    let finished = crate::run(spec, &options, &CancellationToken::new())
        .await
        .map_err(|e| format!("failed to run git: {e}"))?;
    match finished.exit {
        Exit::Code(0) if finished.stdout.total > limit as u64 => Err(format!(
            "git {} printed more than {limit} bytes",
            args.join(" ")
        )),
        Exit::Code(0) => Ok(finished.stdout.head),
        _ => Err(format!(
            "git {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&finished.stderr.head).trim()
        )),
    }
}

/// The most file names, in bytes, a workspace's listing may take: some 500,000 paths.
const LISTING_LIMIT: usize = 64 * 1024 * 1024;

/// The files git tracks or would track in the folder `root`: tracked ones, and untracked ones
/// its ignore rules (every `.gitignore` in the tree and `.git/info/exclude`) do not name, as
/// paths relative to `root`, sorted, each once. Never a file git ignores, nothing inside `.git`,
/// nothing of a nested repository (git lists it as a folder, which is left out).
///
/// `root` is a repository's work tree when `root/.git` exists; otherwise an empty repository
/// made for the call stands in, so that the same rules hold (the tree's `.gitignore` files) and
/// nothing counts as tracked. The account's global excludes file is not read: kavi's git reads
/// no configuration it did not write, and every account sharing a workspace sees one list.
pub async fn listed(root: &Path) -> Result<Vec<std::path::PathBuf>, String> {
    let args = [
        "ls-files",
        "-z",
        "--cached",
        "--others",
        "--exclude-standard",
    ];
    let dot_git = root.join(".git");
    // Kept until the listing is done.
    let mut _empty = None;
    let git_dir = if dot_git.symlink_metadata().is_ok() {
        dot_git
    } else {
        let dir = kavi_foundation::sandbox::private_folder(
            &kavi_foundation::sandbox::memory_temp_dir(),
            "kavi-git-",
        )
        .map_err(|e| {
            format!(
                "cannot make an empty repository to list {}: {e}",
                root.display()
            )
        })?;
        // What makes a folder a git dir, written by hand: `git init` costs a process and a
        // dozen files more, on every listing of a workspace that is no repository.
        let git_dir = dir.path().to_owned();
        std::fs::create_dir(git_dir.join("objects"))
            .and_then(|()| std::fs::create_dir(git_dir.join("refs")))
            .and_then(|()| std::fs::write(git_dir.join("HEAD"), "ref: refs/heads/main\n"))
            .map_err(|e| {
                format!(
                    "cannot make an empty repository to list {}: {e}",
                    root.display()
                )
            })?;
        _empty = Some(dir);
        git_dir
    };
    let out = run_spec(&command_in(&git_dir, root, &args), &args, LISTING_LIMIT)
        .await
        .map_err(|e| format!("cannot list the files of {}: {e}", root.display()))?;
    Ok(parse_listing(&out))
}

/// `ls-files -z` output as paths: a name ending in `/` (a nested repository) is left out, and
/// a path listed twice (an unmerged one) is kept once.
fn parse_listing(out: &[u8]) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    let mut paths: Vec<std::path::PathBuf> = out
        .split(|b| *b == 0)
        .filter(|name| !name.is_empty() && !name.ends_with(b"/"))
        .map(|name| std::ffi::OsStr::from_bytes(name).into())
        .collect();
    paths.sort();
    paths.dedup();
    paths
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

    /// What git lists of a repository: tracked files (an ignored one too), untracked ones its
    /// rules do not ignore, a `!` re-include; never an ignored file, `.git`, a nested
    /// repository's files; a name with a newline whole.
    #[tokio::test]
    async fn listed_holds_what_git_tracks_or_would_track() {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        for folder in ["sub", "nested/inner", "keep"] {
            std::fs::create_dir_all(ws.join(folder)).unwrap();
        }
        let files = [
            (
                ".gitignore",
                ".my.cnf\n*.tfstate\nsub/.netrc\nkeep/*\n!keep/wanted\nforced\n",
            ),
            (".my.cnf", "secret"),
            ("sub/.netrc", "secret"),
            ("sub/prod.tfstate", "secret"),
            ("sub/ok.txt", "ok"),
            ("keep/dropped", "secret"),
            ("keep/wanted", "ok"),
            ("forced", "tracked though ignored"),
            ("new\nline.txt", "ok"),
            ("excluded.env", "secret"),
        ];
        for (name, text) in files {
            std::fs::write(ws.join(name), text).unwrap();
        }
        // Not a repository yet: the tree's .gitignore rules, nothing tracked.
        let before = listed(&ws).await.unwrap();
        assert!(before.contains(&"sub/ok.txt".into()), "{before:?}");
        assert!(!before.contains(&".my.cnf".into()), "{before:?}");
        assert!(!before.contains(&"forced".into()), "{before:?}");
        run(&ws, &["init", "-q", "--template="]).await.unwrap();
        run(&ws, &["add", "--force", "forced", ".gitignore"])
            .await
            .unwrap();
        run(&ws, &["commit", "-q", "-m", "one"]).await.unwrap();
        // A repository made with no template has no info folder.
        std::fs::create_dir_all(ws.join(".git/info")).unwrap();
        std::fs::write(ws.join(".git/info/exclude"), "*.env\n").unwrap();
        let inner = ws.join("nested/inner");
        std::fs::write(inner.join("f"), "other repository").unwrap();
        run(&inner, &["init", "-q", "--template="]).await.unwrap();
        let names: Vec<String> = listed(&ws)
            .await
            .unwrap()
            .iter()
            .map(|p| p.display().to_string())
            .collect();
        assert_eq!(
            names,
            [
                ".gitignore",
                "forced",
                "keep/wanted",
                "new\nline.txt",
                "sub/ok.txt"
            ],
            "{names:?}"
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
