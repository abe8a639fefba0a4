//! Embeds the shipped workspace (kavi.toml, pipelines, policies, chains, templates, proposals,
//! the offline scripted builder and the JSON Schemas its files name) for `kavi init`: a new workspace gets exactly what this
//! checkout ships, and a file added to one of these folders is shipped without a list to edit.

use std::path::Path;

const FOLDERS: [&str; 7] = [
    "pipelines",
    "policies",
    "chains",
    "templates",
    "proposals",
    "builders",
    "docs/schemas",
];

fn main() {
    let mut files = vec!["kavi.toml".to_owned()];
    println!("cargo:rerun-if-changed=kavi.toml");
    for folder in FOLDERS {
        println!("cargo:rerun-if-changed={folder}");
        collect(Path::new(folder), &mut files);
    }
    files.sort();
    let root = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let mut out = String::from(
        "/// The shipped workspace, as (path relative to it, content).\n\
         pub const SHIPPED: &[(&str, &[u8])] = &[\n",
    );
    for file in &files {
        out.push_str(&format!(
            "    ({file:?}, include_bytes!(concat!({root:?}, \"/\", {file:?}))),\n"
        ));
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("shipped.rs");
    std::fs::write(dest, out).expect("OUT_DIR is writable");
    println!("cargo:rustc-env=KAVI_BUILD={}", build_description());
}

/// What `kavi --version` says after the version, as nextest does: the commit built (and its
/// date), the profile and the enabled features. Built outside a git checkout (from a crate
/// package, or without git), the commit is unknown rather than a failed build.
fn build_description() -> String {
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_owned())
            .filter(|text| !text.is_empty())
    };
    // A new commit or a checkout moves HEAD or the branch it names: the description follows.
    let mut watched = vec!["HEAD".to_owned(), "packed-refs".to_owned()];
    watched.extend(git(&["rev-parse", "--symbolic-full-name", "HEAD"]));
    for name in watched {
        if let Some(path) = git(&["rev-parse", "--git-path", &name]) {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    let commit = git(&["log", "-1", "--format=%h %cs", "--abbrev=12"])
        .unwrap_or_else(|| "commit unknown".to_owned());
    let profile = std::env::var("PROFILE").unwrap_or_default();
    let mut features: Vec<String> = std::env::vars()
        .filter_map(|(key, _)| key.strip_prefix("CARGO_FEATURE_").map(str::to_lowercase))
        .collect();
    features.sort();
    let features = match features.is_empty() {
        true => "none".to_owned(),
        false => features.join(", "),
    };
    format!("{commit}, {profile}, features: {features}")
}

/// Every regular file under `dir`, skipping hidden entries and Python's caches.
fn collect(dir: &Path, files: &mut Vec<String>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        if name.starts_with('.') || name == "__pycache__" {
            continue;
        }
        let path = entry.path();
        let Ok(kind) = entry.file_type() else {
            continue;
        };
        if kind.is_dir() {
            collect(&path, files);
        } else if kind.is_file() {
            files.push(path.to_string_lossy().replace('\\', "/"));
        }
    }
}
