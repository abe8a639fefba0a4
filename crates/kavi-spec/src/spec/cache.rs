//! What a node declares about its files (`inputs`, `outputs`, `cache`), as the pipeline
//! loader validates it; the engine's cache (`crate::cache`) keys and restores by it.

use std::path::{Path, PathBuf};

use globset::{GlobBuilder, GlobMatcher};

/// What a node declares about its files, validated when the pipeline loads.
#[derive(Debug)]
pub struct CacheSpec {
    /// Paths or globs relative to the workspace, as written.
    pub inputs: Vec<InputPattern>,
    /// Files relative to the workspace.
    pub outputs: Vec<String>,
    /// `cache = false`: the key is recorded, never looked up.
    pub enabled: bool,
    /// The SHA-256 of the node's definition (its table in the pipeline file, canonicalised).
    pub definition: String,
    /// The files that govern the node, as (`<role>:<path>`, spec hash) when it was loaded.
    pub governing: Vec<(String, String)>,
}

/// One entry of `inputs`.
#[derive(Debug, Clone)]
pub struct InputPattern {
    pub text: String,
    /// The folder the pattern cannot match outside of (its part before the first wildcard).
    base: PathBuf,
    /// `None` for a plain path, which names a file or a whole folder.
    glob: Option<GlobMatcher>,
}

impl InputPattern {
    /// Parses an `inputs` entry; the caller has checked it stays inside the workspace.
    pub fn parse(text: &str) -> Result<Self, String> {
        if crate::template::is_templated(text) {
            return Err("`inputs` are paths and globs, not templates".into());
        }
        let wildcard = text.find(['*', '?', '[', '{']);
        let Some(at) = wildcard else {
            return Ok(Self {
                text: text.to_owned(),
                base: PathBuf::from(text),
                glob: None,
            });
        };
        let base = text[..at].rsplit_once('/').map_or("", |(dir, _)| dir);
        let glob = GlobBuilder::new(text)
            .literal_separator(true)
            .build()
            .map_err(|e| format!("invalid glob `{text}`: {}", e.kind()))?
            .compile_matcher();
        Ok(Self {
            text: text.to_owned(),
            base: PathBuf::from(base),
            glob: Some(glob),
        })
    }

    /// The folder the pattern cannot match outside of, relative to the workspace.
    pub fn base(&self) -> &Path {
        &self.base
    }

    /// The glob a path under [`base`](Self::base) must match; `None` for a plain path.
    pub fn glob(&self) -> Option<&GlobMatcher> {
        self.glob.as_ref()
    }
}

/// Where a declared output lives: its folder must resolve inside the workspace; the file itself
/// is never followed (a link in its place is refused when storing, replaced when restoring).
pub fn output_path(workspace: &Path, output: &str) -> Result<PathBuf, String> {
    let (folder, name) = output.rsplit_once('/').unwrap_or((".", output));
    if name.is_empty() || name == "." || name == ".." {
        return Err(format!("`{output}` does not name a file"));
    }
    Ok(crate::sandbox::contained_path(workspace, folder)
        .map_err(|e| e.replace(&format!("`{folder}`"), &format!("`{output}`")))?
        .join(name))
}
