//! `kavi init [DIR]`: a working workspace, from the files this kavi was built with.

use std::path::Path;

use crate::error::{Error, exit};

include!(concat!(env!("OUT_DIR"), "/shipped.rs"));

/// What `.gitignore` gets: kavi's state, and what the example forge writes.
const IGNORED: [&str; 2] = [".kavi/", "/skills/"];
const IGNORED_WHY: &str = "# kavi's ledger and artifact store, and the skills the forge writes";

/// Adds to `existing` (a `.gitignore`'s text, empty when there is none) the lines of [`IGNORED`]
/// it lacks; returns the new text and the lines added. A user's own lines stay as they were.
fn merged_gitignore(existing: &str) -> (String, Vec<&'static str>) {
    let has = |line: &str| existing.lines().any(|own| own.trim_end() == line);
    let missing: Vec<&str> = IGNORED.into_iter().filter(|line| !has(line)).collect();
    let mut text = existing.to_owned();
    if !missing.is_empty() {
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        text.push_str(IGNORED_WHY);
        text.push('\n');
        for line in &missing {
            text.push_str(line);
            text.push('\n');
        }
    }
    (text, missing)
}

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
    let existing = match std::fs::read_to_string(&gitignore) {
        Ok(text) => Some(text),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(io(format!("failed to read {}", gitignore.display()))(e)),
    };
    let (text, added) = merged_gitignore(existing.as_deref().unwrap_or(""));
    if !added.is_empty() {
        std::fs::write(&gitignore, text)
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
    match (existing.is_some(), added.is_empty()) {
        (false, _) => outln!("  .gitignore"),
        (true, true) => outln!(
            "  .gitignore (kept: it ignores {} already)",
            IGNORED.join(" and ")
        ),
        (true, false) => outln!("  .gitignore (kept, with {} added)", added.join(" and ")),
    }
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

    #[test]
    fn a_gitignore_gets_only_the_lines_it_lacks() {
        let (fresh, added) = merged_gitignore("");
        assert_eq!(added, IGNORED);
        assert_eq!(fresh, format!("{IGNORED_WHY}\n.kavi/\n/skills/\n"));
        let (text, added) = merged_gitignore("target/\n.kavi/  \n");
        assert_eq!(added, ["/skills/"]);
        assert_eq!(
            text,
            format!("target/\n.kavi/  \n{IGNORED_WHY}\n/skills/\n")
        );
        let (text, added) = merged_gitignore("node_modules");
        assert_eq!(added, IGNORED);
        assert!(text.starts_with("node_modules\n#"), "{text}");
        let (text, added) = merged_gitignore(&fresh);
        assert!(added.is_empty());
        assert_eq!(text, fresh);
    }

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
