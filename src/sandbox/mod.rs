//! Sandboxes: an isolated copy of a target tree with a git baseline, and the safe way back.
//!
//! The copy leaves out what policy says (VCS data, virtualenvs, secrets, databases, caches) and
//! every special file (sockets, FIFOs, devices). A fresh git repository with one baseline commit,
//! no hooks and no remotes makes "what did the build change" a question git answers, for tracked
//! and untracked files alike.

use std::io;
use std::path::{Component, Path, PathBuf};

use globset::GlobSet;
use tokio_util::sync::CancellationToken;

use crate::process::{self, CaptureOptions, CommandSpec, Exit};

/// What a tree copy did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CopyStats {
    pub files: usize,
    pub skipped: usize,
}

/// Copies `source` into the empty folder `dest`, leaving out paths matching `skip` and the
/// absolute paths in `exclude` (kavi's own state, which may live inside the source). Empty
/// folders are not copied.
pub fn copy_tree(
    source: &Path,
    dest: &Path,
    skip: &GlobSet,
    exclude: &[PathBuf],
) -> io::Result<CopyStats> {
    let mut stats = CopyStats::default();
    let mut walker = walkdir::WalkDir::new(source)
        .follow_links(false)
        .sort_by_file_name()
        .into_iter();
    while let Some(entry) = walker.next() {
        let entry = entry.map_err(io::Error::other)?;
        let relative = entry
            .path()
            .strip_prefix(source)
            .expect("walkdir yields paths under its root");
        if relative.as_os_str().is_empty() {
            continue;
        }
        let file_type = entry.file_type();
        let excluded = exclude.iter().any(|e| entry.path().starts_with(e));
        if excluded || skip.is_match(relative) {
            stats.skipped += 1;
            if file_type.is_dir() {
                walker.skip_current_dir();
            }
            continue;
        }
        let target = dest.join(relative);
        if file_type.is_dir() {
            // Folders are made when a file goes into them: git tracks no empty folder, and a
            // folder whose contents were all left out should not appear at all.
            continue;
        }
        if file_type.is_file() || file_type.is_symlink() {
            std::fs::create_dir_all(target.parent().expect("a copied path has a parent"))?;
        }
        if file_type.is_file() {
            std::fs::copy(entry.path(), &target)?;
            stats.files += 1;
        } else if file_type.is_symlink() {
            // Kept as the link it is (git records links); copy-back refuses links anyway.
            std::os::unix::fs::symlink(std::fs::read_link(entry.path())?, &target)?;
            stats.files += 1;
        } else {
            // Sockets, FIFOs and devices: reading one could block or leak, so none are copied.
            stats.skipped += 1;
        }
    }
    Ok(stats)
}

/// Runs git in `dir` with no user or system configuration, no hooks, and a fixed identity.
pub async fn git(dir: &Path, args: &[&str]) -> Result<String, String> {
    let mut argv = vec![
        "-c",
        "core.hooksPath=/dev/null",
        "-c",
        "core.quotepath=off",
        "-c",
        "commit.gpgsign=false",
        "-c",
        "user.name=kavi",
        "-c",
        "user.email=kavi@localhost",
    ];
    argv.extend_from_slice(args);
    let spec = CommandSpec {
        program: "git".into(),
        args: argv.iter().map(|s| (*s).to_owned()).collect(),
        env: vec![
            ("PATH".into(), std::env::var("PATH").unwrap_or_default()),
            ("HOME".into(), dir.display().to_string()),
            ("GIT_CONFIG_NOSYSTEM".into(), "1".into()),
            ("GIT_CONFIG_GLOBAL".into(), "/dev/null".into()),
            ("LC_ALL".into(), "C".into()),
        ],
        cwd: dir.to_owned(),
        stdin: None,
    };
    let options = CaptureOptions {
        limit: 16 * 1024 * 1024,
        spill_dir: std::env::temp_dir(),
    };
    let finished = process::run(&spec, &options, &CancellationToken::new())
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
pub async fn init_baseline(dir: &Path) -> Result<String, String> {
    // An empty template: no sample hooks, nothing from the machine's git installation.
    git(dir, &["init", "-q", "--template=", "-b", "baseline"]).await?;
    // --force: the baseline holds every copied file, even ones the tree's .gitignore names;
    // otherwise those would look like changes made by the build.
    git(dir, &["add", "--all", "--force"]).await?;
    git(
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
    Ok(git(dir, &["rev-parse", "HEAD"]).await?.trim().to_owned())
}

/// Every path that differs from the baseline: modified, deleted, added, tracked or not.
/// Untracked files are listed whatever `.gitignore` says, so a build cannot hide a file by
/// ignoring it.
pub async fn changed_paths(dir: &Path) -> Result<Vec<String>, String> {
    let tracked = git(dir, &["diff", "--name-only", "-z", "--no-renames", "HEAD"]).await?;
    let untracked = git(dir, &["ls-files", "--others", "-z"]).await?;
    let mut paths: Vec<String> = tracked
        .split('\0')
        .chain(untracked.split('\0'))
        .filter(|p| !p.is_empty())
        .map(str::to_owned)
        .collect();
    paths.sort();
    paths.dedup();
    Ok(paths)
}

/// Why a relative path may not be used to write into a target, if it may not: it must be
/// relative, normalised (no `.`, `..`, empty or trailing parts) and plain.
pub fn unsafe_path_reason(path: &str) -> Option<&'static str> {
    if path.is_empty() {
        return Some("the path is empty");
    }
    if path.starts_with('/') {
        return Some("the path is absolute");
    }
    if path.contains('\0') || path.contains('\\') {
        return Some("the path holds a NUL or a backslash");
    }
    for part in path.split('/') {
        match part {
            "" => return Some("the path is not normalised (empty part)"),
            "." => return Some("the path is not normalised (`.` part)"),
            ".." => return Some("the path contains `..`"),
            _ => {}
        }
    }
    let normal = Path::new(path)
        .components()
        .all(|c| matches!(c, Component::Normal(_)));
    if !normal {
        return Some("the path is not normalised");
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unsafe_paths_are_named_with_a_reason() {
        assert_eq!(unsafe_path_reason("skills/a/skill.py"), None);
        assert_eq!(unsafe_path_reason("../x"), Some("the path contains `..`"));
        assert_eq!(unsafe_path_reason("a/../b"), Some("the path contains `..`"));
        assert_eq!(
            unsafe_path_reason("/etc/passwd"),
            Some("the path is absolute")
        );
        assert!(unsafe_path_reason("a//b").unwrap().contains("normalised"));
        assert!(unsafe_path_reason("./a").unwrap().contains("normalised"));
        assert!(unsafe_path_reason("a/").unwrap().contains("normalised"));
    }

    #[test]
    fn copy_tree_skips_policy_matches_excluded_state_and_special_files() {
        let source = tempfile::tempdir().unwrap();
        let dest = tempfile::tempdir().unwrap();
        let root = source.path();
        std::fs::create_dir_all(root.join("src")).unwrap();
        std::fs::create_dir_all(root.join(".git/objects")).unwrap();
        std::fs::create_dir_all(root.join(".kavi")).unwrap();
        std::fs::write(root.join("src/lib.py"), "x = 1\n").unwrap();
        std::fs::write(root.join(".env"), "TOKEN=secret\n").unwrap();
        std::fs::write(root.join("src/server.pem"), "key").unwrap();
        std::fs::write(root.join(".git/objects/o"), "o").unwrap();
        std::fs::write(root.join(".kavi/ledger.db"), "db").unwrap();
        nix::unistd::mkfifo(&root.join("pipe"), nix::sys::stat::Mode::S_IRWXU).unwrap();
        std::os::unix::fs::symlink("src/lib.py", root.join("link")).unwrap();

        let mut builder = globset::GlobSetBuilder::new();
        for pattern in [".git", "**/.env", "**/*.pem"] {
            builder.add(globset::Glob::new(pattern).unwrap());
        }
        let skip = builder.build().unwrap();
        let stats = copy_tree(root, dest.path(), &skip, &[root.join(".kavi")]).unwrap();

        let d = dest.path();
        assert_eq!(
            std::fs::read_to_string(d.join("src/lib.py")).unwrap(),
            "x = 1\n"
        );
        for gone in [".env", "src/server.pem", ".git", ".kavi", "pipe"] {
            assert!(!d.join(gone).exists(), "{gone} was copied");
        }
        assert!(
            d.join("link")
                .symlink_metadata()
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert_eq!(
            stats,
            CopyStats {
                files: 2,
                skipped: 5
            }
        );
    }
}
