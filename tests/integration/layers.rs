//! The invariants of ARCHITECTURE.md that the compiler cannot see, read from the source: one
//! crate starts processes (kavi-process), and within it one module builds git commands.

use std::path::{Path, PathBuf};

use crate::common;

/// How starting a process is spelt in Rust source.
const STARTS_A_PROCESS: &[&str] = &[
    "std::process::Command",
    "tokio::process::Command",
    "Command::new(",
    "libc::fork",
    "unistd::fork",
    "libc::clone",
    "execve(",
    "execvp(",
    "posix_spawn",
];

/// Every Rust file of the workspace's crates, without comments and unit tests, by path
/// relative to the repository.
fn sources() -> Vec<(PathBuf, String)> {
    let repo = common::repo();
    let mut roots = vec![repo.join("src")];
    for krate in std::fs::read_dir(repo.join("crates")).unwrap() {
        roots.push(krate.unwrap().path().join("src"));
    }
    let mut files = Vec::new();
    for root in roots {
        for entry in walkdir::WalkDir::new(root) {
            let entry = entry.unwrap();
            let path = entry.path();
            let name = path.file_name().unwrap().to_string_lossy();
            if path.extension().is_none_or(|e| e != "rs") || name == "tests.rs" {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            let code = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap()
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            files.push((path.strip_prefix(repo).unwrap().to_owned(), code));
        }
    }
    files
}

fn naming(files: &[(PathBuf, String)], markers: &[&str]) -> Vec<String> {
    files
        .iter()
        .flat_map(|(path, code)| {
            markers
                .iter()
                .filter(|marker| code.contains(*marker))
                .map(move |marker| format!("{} ({marker})", path.display()))
        })
        .collect()
}

#[test]
fn only_the_process_crate_starts_processes() {
    let files = sources();
    let (inside, outside): (Vec<_>, Vec<_>) = files
        .into_iter()
        .partition(|(path, _)| path.starts_with("crates/kavi-process"));
    // The scan sees the one place that does start them.
    assert!(
        !naming(&inside, STARTS_A_PROCESS).is_empty(),
        "found no process start in kavi-process: the scan is blind"
    );
    assert_eq!(naming(&outside, STARTS_A_PROCESS), Vec::<String>::new());
}

#[test]
fn only_the_git_module_names_the_git_program() {
    let files = sources();
    let git = Path::new("crates/kavi-process/src/git.rs");
    let (inside, outside): (Vec<_>, Vec<_>) = files.into_iter().partition(|(path, _)| path == git);
    assert!(
        !naming(&inside, &["\"git\""]).is_empty(),
        "git.rs names no git program"
    );
    assert_eq!(naming(&outside, &["\"git\""]), Vec::<String>::new());
}
