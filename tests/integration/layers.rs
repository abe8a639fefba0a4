//! The invariants of ARCHITECTURE.md that the compiler cannot see, read from the source: one
//! crate starts processes (kavi-process), and within it one module builds git commands; the
//! crate graph it documents is the one the manifests declare; and a test that skips fails
//! under CI.

use std::collections::BTreeMap;
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
    "execv(",
    "execve(",
    "execvp(",
    "vfork",
    "posix_spawn",
];

/// Every Rust file under `roots` (folders of the repository), with its text, by path relative
/// to the repository.
fn rust_files(roots: &[PathBuf]) -> Vec<(PathBuf, String)> {
    let repo = common::repo();
    let mut files = Vec::new();
    for root in roots {
        for entry in walkdir::WalkDir::new(root) {
            let entry = entry.unwrap();
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let text = std::fs::read_to_string(path).unwrap();
            files.push((path.strip_prefix(repo).unwrap().to_owned(), text));
        }
    }
    files
}

/// The `src` folders of the root package and of every workspace crate.
fn source_roots() -> Vec<PathBuf> {
    let repo = common::repo();
    let mut roots = vec![repo.join("src")];
    for krate in std::fs::read_dir(repo.join("crates")).unwrap() {
        roots.push(krate.unwrap().path().join("src"));
    }
    roots
}

/// Every Rust file of the workspace's crates, without comments and unit tests, by path
/// relative to the repository.
fn sources() -> Vec<(PathBuf, String)> {
    rust_files(&source_roots())
        .into_iter()
        .filter(|(path, _)| path.file_name().is_some_and(|name| name != "tests.rs"))
        .map(|(path, text)| {
            let code = text
                .split("#[cfg(test)]\nmod tests")
                .next()
                .unwrap()
                .lines()
                .filter(|line| !line.trim_start().starts_with("//"))
                .collect::<Vec<_>>()
                .join("\n");
            (path, code)
        })
        .collect()
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

/// Each workspace crate's kavi dependencies, as its `Cargo.toml` declares them (build and dev
/// dependencies aside: they do not make a layer).
fn declared_graph(repo: &Path) -> BTreeMap<String, Vec<String>> {
    let mut manifests = vec![repo.join("Cargo.toml")];
    for krate in std::fs::read_dir(repo.join("crates")).unwrap() {
        manifests.push(krate.unwrap().path().join("Cargo.toml"));
    }
    manifests
        .iter()
        .map(|manifest| {
            let text = std::fs::read_to_string(manifest).unwrap();
            let value: toml::Table = toml::from_str(&text).unwrap();
            let name = value["package"]["name"].as_str().unwrap().to_owned();
            let mut kavi: Vec<String> = value
                .get("dependencies")
                .and_then(toml::Value::as_table)
                .map(|deps| {
                    deps.keys()
                        .filter(|dep| dep.starts_with("kavi"))
                        .cloned()
                        .collect()
                })
                .unwrap_or_default();
            kavi.sort();
            (name, kavi)
        })
        .collect()
}

/// The table of ARCHITECTURE.md's "Crates" section: `| \`crate\` | \`dep\`, ... |`, or `none`.
fn documented_graph(architecture: &str) -> BTreeMap<String, Vec<String>> {
    let cells = |cell: &str| -> Vec<String> {
        cell.split(',')
            .map(|name| name.trim().trim_matches('`').to_owned())
            .filter(|name| !name.is_empty() && name != "none")
            .collect()
    };
    architecture
        .lines()
        .filter_map(|line| {
            let row: Vec<&str> = line.trim().trim_matches('|').split('|').collect();
            let [krate, deps] = row.as_slice() else {
                return None;
            };
            let krate = krate.trim();
            (krate.starts_with("`kavi") && krate.ends_with('`')).then(|| {
                let mut deps = cells(deps);
                deps.sort();
                (krate.trim_matches('`').to_owned(), deps)
            })
        })
        .collect()
}

#[test]
fn the_crate_graph_is_the_one_architecture_md_documents() {
    let repo = common::repo();
    let documented =
        documented_graph(&std::fs::read_to_string(repo.join("ARCHITECTURE.md")).unwrap());
    let declared = declared_graph(repo);
    // The table is read at all: the foundation and the binary are in it.
    assert!(
        documented.contains_key("kavi-foundation") && documented.contains_key("kavi"),
        "ARCHITECTURE.md has no crate table: {documented:?}"
    );
    assert_eq!(documented, declared);
}

/// A test that cannot run here says "skipping: why" and returns, which libtest reports as
/// passed: each such place must first fail when `CI` is set, where everything it needs is
/// installed (`.ci/run`), so that CI never passes a test that asserted nothing.
#[test]
fn every_test_that_skips_fails_under_ci() {
    let repo = common::repo();
    let mut roots = source_roots();
    roots.push(repo.join("tests"));
    let mut skips = 0;
    let mut unguarded = Vec::new();
    for (path, text) in rust_files(&roots) {
        for (at, _) in text.match_indices("eprintln!(") {
            let said = text[at + "eprintln!(".len()..].trim_start();
            if !said.starts_with("\"skipp") {
                continue;
            }
            skips += 1;
            // From the start of the function that says it.
            let function = text[..at].rfind("fn ").unwrap_or(0);
            if !text[function..at].contains("var_os(\"CI\")") {
                let line = text[..at].matches('\n').count() + 1;
                unguarded.push(format!("{}:{line}", path.display()));
            }
        }
    }
    assert!(skips > 0, "found no test that skips: the scan is blind");
    assert_eq!(unguarded, Vec::<String>::new());
}
