//! `kavi init [DIR]`: a working workspace, from the files this kavi was built with.

use std::path::Path;

use crate::error::{Error, exit};

include!(concat!(env!("OUT_DIR"), "/shipped.rs"));

/// What `.gitignore` gets: kavi's state, and what the example forge writes.
const GITIGNORE: &str =
    "# kavi's ledger and artifact store, and the skills the forge writes\n.kavi/\n/skills/\n";

/// Writes the shipped workspace into `dir` (made if missing) and says what it wrote. A folder
/// that is a workspace already (it has kavi.toml) is refused, and no existing file is replaced.
pub fn run(dir: &Path) -> Result<i32, Error> {
    let io = |context: String| move |source| Error::Io { context, source };
    if dir.join("kavi.toml").exists() {
        return Err(Error::Usage(format!(
            "{} is a kavi workspace already (it has kavi.toml); nothing was written",
            dir.display()
        )));
    }
    let existing: Vec<&str> = SHIPPED
        .iter()
        .map(|(path, _)| *path)
        .filter(|path| dir.join(path).symlink_metadata().is_ok())
        .collect();
    if !existing.is_empty() {
        return Err(Error::Usage(format!(
            "{} already holds {}; nothing was written (init writes into an empty folder or one \
             without these files)",
            dir.display(),
            existing.join(", ")
        )));
    }
    for (path, bytes) in SHIPPED {
        let target = dir.join(path);
        let parent = target.parent().expect("shipped files lie in the workspace");
        std::fs::create_dir_all(parent)
            .map_err(io(format!("failed to create {}", parent.display())))?;
        std::fs::write(&target, bytes)
            .map_err(io(format!("failed to write {}", target.display())))?;
    }
    let gitignore = dir.join(".gitignore");
    if !gitignore.exists() {
        std::fs::write(&gitignore, GITIGNORE)
            .map_err(io(format!("failed to write {}", gitignore.display())))?;
    }
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for (path, _) in SHIPPED {
        let top = path.split('/').next().unwrap_or(path);
        match counts.iter_mut().find(|(name, _)| *name == top) {
            Some((_, count)) => *count += 1,
            None => counts.push((top, 1)),
        }
    }
    outln!("initialized a kavi workspace in {}:", dir.display());
    for (top, count) in counts {
        if count == 1 && !top.contains('.') {
            outln!("  {top}/ (1 file)");
        } else if top.contains('.') {
            outln!("  {top}");
        } else {
            outln!("  {top}/ ({count} files)");
        }
    }
    outln!("  .gitignore");
    outln!();
    outln!("next: forge the example skill, offline (the first run provisions the gate tools):");
    outln!(
        "  cd {} && kavi pipeline run forge --set skill=word_count",
        dir.display()
    );
    Ok(exit::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The embedded set is what the checkout ships: every file of the shipped folders.
    #[test]
    fn the_shipped_workspace_is_embedded_whole() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR"));
        for folder in [
            "pipelines",
            "policies",
            "chains",
            "templates",
            "proposals",
            "builders",
            "docs/schemas",
        ] {
            for entry in walkdir::WalkDir::new(root.join(folder)) {
                let entry = entry.unwrap();
                let relative = entry.path().strip_prefix(root).unwrap().to_string_lossy();
                if !entry.file_type().is_file() || relative.contains("__pycache__") {
                    continue;
                }
                let shipped = SHIPPED.iter().find(|(path, _)| *path == relative);
                let (_, bytes) = shipped.unwrap_or_else(|| panic!("{relative} is not embedded"));
                assert_eq!(*bytes, std::fs::read(entry.path()).unwrap(), "{relative}");
            }
        }
        assert!(SHIPPED.iter().any(|(path, _)| *path == "kavi.toml"));
    }
}
