//! A policy file as the node kinds load it: its parsed value and the text it came from. Generic
//! over what the file holds; the forge's policies are the forge's own.

use std::path::Path;
use std::sync::Arc;

use crate::diagnostic::SourceFile;

/// A parsed policy and the text it came from.
#[derive(Debug, Clone)]
pub struct Policy<T> {
    pub value: T,
    pub source: Arc<SourceFile>,
}

/// Reads a policy file, named relative to the workspace root.
pub fn read(root: &Path, relative: &str) -> Result<Arc<SourceFile>, String> {
    let text = crate::diagnostic::read_spec(&root.join(relative))
        .map_err(|e| format!("failed to read policy {relative}: {e}"))?;
    Ok(SourceFile::new(relative, text))
}
