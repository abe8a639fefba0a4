//! A policy file as the node kinds load it: its parsed value and the text it came from. Generic
//! over what the file holds; the forge's policies are the forge's own.

use std::path::{Component, Path};
use std::sync::Arc;

use crate::diagnostic::SourceFile;

/// The folders whose files govern a workspace, beside `kavi.toml`: an adopted rule set is their
/// files, so a policy is read from nowhere else.
pub const GOVERNING_FOLDERS: [&str; 4] = ["pipelines", "policies", "templates", "chains"];

/// A parsed policy and the text it came from.
#[derive(Debug, Clone)]
pub struct Policy<T> {
    pub value: T,
    pub source: Arc<SourceFile>,
}

/// Reads a policy file, named relative to the workspace root. Only a file the rule set holds is
/// read: one in a governing folder, not hidden, with no symlink on the way (a link would govern
/// with a file the adopted set never held, changed without a rule change).
pub fn read(root: &Path, relative: &str) -> Result<Arc<SourceFile>, String> {
    let path = Path::new(relative);
    let components: Vec<Component<'_>> = path.components().collect();
    let governed = matches!(components.first(), Some(Component::Normal(folder))
            if folder.to_str().is_some_and(|f| GOVERNING_FOLDERS.contains(&f)))
        && components.len() > 1
        && components.iter().all(
            |c| matches!(c, Component::Normal(name) if !name.to_string_lossy().starts_with('.')),
        );
    if !governed {
        return Err(format!(
            "refusing policy {relative}: a policy is read only from the governing folders ({}/), \
             whose files the adopted rule set holds, and not from a hidden file",
            GOVERNING_FOLDERS.join("/, ")
        ));
    }
    if kavi_foundation::sandbox::links_below(root, path) {
        return Err(format!(
            "refusing policy {relative}: a symlink lies on the way to it, and a policy must be a \
             file of the workspace itself"
        ));
    }
    let text = crate::diagnostic::read_spec(&root.join(relative))
        .map_err(|e| format!("failed to read policy {relative}: {e}"))?;
    Ok(SourceFile::new(relative, text))
}

#[cfg(test)]
mod tests {
    use super::read;

    #[test]
    fn a_policy_outside_the_governing_folders_or_behind_a_link_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let at = |p: &str| root.path().join(p);
        std::fs::create_dir_all(at("policies")).unwrap();
        std::fs::create_dir_all(at("rules")).unwrap();
        std::fs::write(at("policies/scanner.toml"), "a = 1\n").unwrap();
        std::fs::write(at("rules/scanner.toml"), "a = 2\n").unwrap();
        std::os::unix::fs::symlink("../rules/scanner.toml", at("policies/linked.toml")).unwrap();
        assert_eq!(
            read(root.path(), "policies/scanner.toml").unwrap().text,
            "a = 1\n"
        );
        for outside in [
            "rules/scanner.toml",
            "policies/../rules/scanner.toml",
            "policies/.hidden.toml",
            "/etc/passwd",
            "policies",
        ] {
            let refused = read(root.path(), outside).unwrap_err();
            assert!(
                refused.contains("only from the governing folders"),
                "{outside}: {refused}"
            );
        }
        let linked = read(root.path(), "policies/linked.toml").unwrap_err();
        assert!(linked.contains("a symlink lies on the way"), "{linked}");
    }
}
