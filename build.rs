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
