//! A toolchain's files checked against what pip installed: every file each installed
//! distribution's `RECORD` lists with a hash must still have that hash (the tools' scripts in
//! `bin/` included: pip records the scripts it writes), no other file may sit among the
//! installed packages or in `bin/`, and the environment's interpreter must still be the link
//! `venv` made. A package version alone says nothing of its bytes: a copy of the environment with
//! `bin/mypy` replaced by a script printing "Success" held the pinned versions.
//!
//! Bytecode (`__pycache__/*.pyc`) is written at install and listed without a hash; it is left
//! out here.

use std::collections::BTreeSet;
use std::path::{Component, Path, PathBuf};

use base64::Engine;
use sha2::{Digest, Sha256};

/// What `python -m venv` puts in `bin/` besides pip's scripts: its activation scripts (never
/// run by kavi) and the interpreter's links (checked to be links).
const VENV_SCRIPTS: &[&str] = &["activate", "activate.csh", "activate.fish", "Activate.ps1"];

/// Checks the environment at `folder`; the error names the first file that is not as pip
/// installed it.
pub fn verify(folder: &Path) -> Result<(), String> {
    let site = site_packages(folder)?;
    let mut listed = BTreeSet::new();
    let records = std::fs::read_dir(&site)
        .map_err(|e| format!("cannot read {}: {e}", site.display()))?
        .flatten()
        .map(|entry| entry.path())
        .filter(|path| path.extension().is_some_and(|e| e == "dist-info"))
        .map(|info| info.join("RECORD"));
    for record in records {
        let text = std::fs::read_to_string(&record)
            .map_err(|e| format!("cannot read {}: {e}", record.display()))?;
        for line in text.lines().filter(|l| !l.trim().is_empty()) {
            let (path, hash) = entry(line).ok_or_else(|| {
                format!("{} has a line kavi cannot read: {line}", record.display())
            })?;
            let file = normal(&site.join(&path));
            if !file.starts_with(folder) {
                return Err(format!(
                    "{} lists {path}, outside the environment",
                    record.display()
                ));
            }
            if let Some(expected) = hash {
                check_hash(&file, expected, &record)?;
            }
            listed.insert(file);
        }
    }
    let unlisted = |path: &Path| !listed.contains(path);
    for entry in walkdir::WalkDir::new(&site).follow_links(false) {
        let entry = entry.map_err(|e| format!("cannot read {}: {e}", site.display()))?;
        let path = entry.path();
        let bytecode = path.components().any(|c| c.as_os_str() == "__pycache__");
        if !entry.file_type().is_dir() && !bytecode && unlisted(path) {
            return Err(format!(
                "{} was not installed by pip (no distribution's RECORD lists it)",
                path.display()
            ));
        }
    }
    let bin = folder.join("bin");
    for entry in std::fs::read_dir(&bin)
        .map_err(|e| format!("cannot read {}: {e}", bin.display()))?
        .flatten()
    {
        let path = entry.path();
        let name = entry.file_name().to_string_lossy().into_owned();
        if name == "python" || name.starts_with("python3") {
            if !path.is_symlink() {
                return Err(format!(
                    "{} is not the link to the interpreter that venv made",
                    path.display()
                ));
            }
        } else if !VENV_SCRIPTS.contains(&name.as_str()) && unlisted(&path) {
            return Err(format!(
                "{} was not installed by pip (no distribution's RECORD lists it)",
                path.display()
            ));
        }
    }
    Ok(())
}

/// The one `lib/pythonX.Y/site-packages` of the environment.
fn site_packages(folder: &Path) -> Result<PathBuf, String> {
    let lib = folder.join("lib");
    std::fs::read_dir(&lib)
        .map_err(|e| format!("cannot read {}: {e}", lib.display()))?
        .flatten()
        .map(|entry| entry.path().join("site-packages"))
        .find(|site| site.is_dir())
        .ok_or_else(|| format!("{} holds no site-packages", lib.display()))
}

/// A RECORD line's path and `sha256=` hash (none for a file listed without one). RECORD is CSV:
/// a path holding a comma or a quote is quoted.
fn entry(line: &str) -> Option<(String, Option<&str>)> {
    let (path, rest) = match line.strip_prefix('"') {
        Some(quoted) => {
            let mut path = String::new();
            let mut chars = quoted.char_indices();
            loop {
                let (at, c) = chars.next()?;
                if c == '"' {
                    if quoted[at + 1..].starts_with('"') {
                        path.push('"');
                        chars.next();
                    } else {
                        break (path, quoted[at + 1..].strip_prefix(',')?);
                    }
                } else {
                    path.push(c);
                }
            }
        }
        None => {
            let (path, rest) = line.split_once(',')?;
            (path.to_owned(), rest)
        }
    };
    let hash = rest.split(',').next().unwrap_or_default();
    if hash.is_empty() {
        return Some((path, None));
    }
    Some((path, Some(hash.strip_prefix("sha256=")?)))
}

/// `path` with `..` and `.` resolved by the text alone (links are not followed).
fn normal(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn check_hash(file: &Path, expected: &str, record: &Path) -> Result<(), String> {
    let bytes = match std::fs::symlink_metadata(file) {
        Ok(meta) if meta.is_file() => std::fs::read(file),
        Ok(_) => Err(std::io::Error::other("it is not a regular file")),
        Err(e) => Err(e),
    }
    .map_err(|e| {
        format!(
            "{} cannot be checked against {}: {e}",
            file.display(),
            record.display()
        )
    })?;
    let found = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(&bytes));
    if found != expected {
        return Err(format!(
            "{} is not the file pip installed: its sha256 is {found}, {} records {expected}",
            file.display(),
            record.display()
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_lines_give_their_path_and_hash_quoted_or_not() {
        assert_eq!(
            entry("../../../bin/mypy,sha256=71l0q1,287"),
            Some(("../../../bin/mypy".to_owned(), Some("71l0q1")))
        );
        assert_eq!(
            entry("mypy-2.4.1.dist-info/RECORD,,"),
            Some(("mypy-2.4.1.dist-info/RECORD".to_owned(), None))
        );
        assert_eq!(
            entry("\"a,\"\"b\"\".py\",sha256=xyz,3"),
            Some(("a,\"b\".py".to_owned(), Some("xyz")))
        );
        assert_eq!(entry("x.py,md5=abc,3"), None);
    }

    fn environment() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let site = dir.path().join("lib/python3.11/site-packages");
        std::fs::create_dir_all(site.join("tool-1.0.dist-info")).unwrap();
        std::fs::create_dir_all(dir.path().join("bin")).unwrap();
        std::fs::write(site.join("tool.py"), "print('tool')\n").unwrap();
        std::fs::write(dir.path().join("bin/tool"), "#!/bin/python\nimport tool\n").unwrap();
        std::os::unix::fs::symlink("/usr/bin/python3", dir.path().join("bin/python")).unwrap();
        let hash = |bytes: &[u8]| {
            base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(Sha256::digest(bytes))
        };
        std::fs::write(
            site.join("tool-1.0.dist-info/RECORD"),
            format!(
                "tool.py,sha256={},14\n../../../bin/tool,sha256={},26\ntool-1.0.dist-info/RECORD,,\n",
                hash(b"print('tool')\n"),
                hash(b"#!/bin/python\nimport tool\n")
            ),
        )
        .unwrap();
        dir
    }

    #[test]
    fn an_environment_as_pip_installed_it_passes_and_each_change_is_named() {
        let dir = environment();
        verify(dir.path()).unwrap();

        std::fs::write(dir.path().join("bin/tool"), "#!/bin/sh\necho Success\n").unwrap();
        let err = verify(dir.path()).unwrap_err();
        assert!(
            err.contains("bin/tool is not the file pip installed"),
            "{err}"
        );

        let dir = environment();
        std::fs::write(
            site_packages(dir.path()).unwrap().join("sitecustomize.py"),
            "",
        )
        .unwrap();
        let err = verify(dir.path()).unwrap_err();
        assert!(
            err.contains("sitecustomize.py was not installed by pip"),
            "{err}"
        );

        let dir = environment();
        std::fs::remove_file(dir.path().join("bin/python")).unwrap();
        std::fs::write(dir.path().join("bin/python"), "#!/bin/sh\n").unwrap();
        let err = verify(dir.path()).unwrap_err();
        assert!(err.contains("bin/python is not the link"), "{err}");

        let dir = environment();
        std::fs::write(dir.path().join("bin/extra"), "").unwrap();
        let err = verify(dir.path()).unwrap_err();
        assert!(err.contains("bin/extra was not installed by pip"), "{err}");
    }
}
