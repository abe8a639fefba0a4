//! kavi's own record of an environment it provisioned: the folder's content manifest (see
//! [`kavi_foundation::content::manifest`]) taken right after pip installed the locked, hashed
//! set, kept beside the folder (`<folder>.provisioned`) and MACed with this account's journal
//! key (see [`kavi_journal::keys`]).
//!
//! The environment's own files (`kavi-toolchain.json`, each distribution's `RECORD`) say what it
//! claims about itself, and a copy of the cache with a planted `.pth` listed in a `RECORD` says
//! the same. The record is what kavi saw it install: before a gate runs a tool, the folder's
//! manifest is taken again and must be the recorded one, for this declaration, at this path,
//! under a MAC only a kavi holding these keys could make. A copied folder (another path), a file
//! changed since, a record edited or made by another machine's kavi: each is not trusted, and
//! kavi provisions the environment again.
//!
//! The record is the machine's, not a ledger's: the cache serves every workspace of the account
//! (a new workspace reuses it, offline), and its trust rests on the same key the journal does.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::Toolchain;
use kavi_foundation::content;

/// The record's name beside the environment's folder.
const SUFFIX: &str = "provisioned";

/// How many differences a refusal names.
const NAMED: usize = 5;

#[derive(Debug, Serialize, Deserialize)]
struct Record {
    toolchain: String,
    /// The declaration's hash (see [`Toolchain::hash`]).
    declaration: String,
    path: PathBuf,
    /// `sha256:` of `manifest`.
    content: String,
    provisioned_at: String,
    /// HMAC-SHA256 of [`signed`], with the journal's key.
    mac: String,
    /// The manifest itself, so that a refusal can say what differs.
    manifest: String,
}

/// An environment whose content is the recorded one: what the gates may run.
#[derive(Debug, Clone)]
pub struct Held {
    /// `sha256:` of its content manifest.
    pub content: String,
    /// Its stamps, taken before the manifest (see [`content::stamps`]): a change made after
    /// the check moves them.
    pub stamps: String,
}

/// The record beside `folder`.
pub fn record_path(folder: &Path) -> PathBuf {
    folder.with_extension(SUFFIX)
}

/// `sha256:` of a manifest's text.
fn digest(manifest: &str) -> String {
    kavi_foundation::hash::spec_hash(manifest)
}

/// What the MAC covers: the declaration, the folder and the content, each on its own line.
fn signed(declaration: &str, path: &Path, content: &str) -> String {
    let text = format!(
        "kavi-provisioned-v1\n{declaration}\n{}\n{content}\n",
        path.display()
    );
    kavi_foundation::hash::sha256_hex(text.as_bytes())
}

/// What names this key among the folders of a cache (see [`Toolchain::folder_in`]): a MAC of a
/// fixed text, which says nothing of the key itself.
pub fn key_name() -> Result<String, String> {
    Ok(kavi_journal::keys::mac_key()?.mac("kavi-toolchain-folder"))
}

fn mac_of(declaration: &str, path: &Path, content: &str) -> Result<String, String> {
    let key = kavi_journal::keys::mac_key()?;
    Ok(key.mac(&signed(declaration, path, content)))
}

/// Records `folder` as kavi just installed it for `toolchain`: its manifest now, MACed. Returns
/// what a gate runs it as.
pub fn write(toolchain: &Toolchain, folder: &Path) -> Result<Held, String> {
    let stamps = content::stamps(folder)?;
    let manifest = content::manifest(folder)?;
    let declaration = toolchain.hash();
    let hash = digest(&manifest);
    let record = Record {
        toolchain: toolchain.name.clone(),
        mac: mac_of(&declaration, folder, &hash)?,
        declaration,
        path: folder.to_owned(),
        content: hash.clone(),
        provisioned_at: jiff::Timestamp::now().to_string(),
        manifest,
    };
    let path = record_path(folder);
    let temp = path.with_extension(format!("{SUFFIX}.partial"));
    let text = serde_json::to_string(&record).expect("a record serializes");
    std::fs::write(&temp, text)
        .and_then(|()| std::fs::rename(&temp, &path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))?;
    Ok(Held {
        content: hash,
        stamps,
    })
}

/// `folder`, if it is the environment kavi recorded installing for `toolchain` there; else why
/// not, naming what differs where it can.
pub fn check(toolchain: &Toolchain, folder: &Path) -> Result<Held, String> {
    let path = record_path(folder);
    let text = match std::fs::read_to_string(&path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(format!(
                "kavi has no record of installing it ({} is missing)",
                path.display()
            ));
        }
        Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
    };
    let record: Record = serde_json::from_str(&text)
        .map_err(|e| format!("its record {} is not one kavi wrote: {e}", path.display()))?;
    if record.path != folder {
        return Err(format!(
            "its record is of an environment kavi installed at {}, not here (a copy)",
            record.path.display()
        ));
    }
    if record.declaration != toolchain.hash() {
        return Err(format!(
            "its record is of another declaration ({}, not {})",
            record.declaration,
            toolchain.hash()
        ));
    }
    if record.mac != mac_of(&record.declaration, &record.path, &record.content)? {
        return Err(format!(
            "its record {} was not made with this account's key (another machine's, or edited)",
            path.display()
        ));
    }
    // Stamps first: a change made while the manifest is taken moves them.
    let stamps = content::stamps(folder)?;
    let manifest = content::manifest(folder)?;
    let hash = digest(&manifest);
    if hash != record.content {
        // The recorded text is checked against the MACed hash before it is quoted.
        let changed = if digest(&record.manifest) == record.content {
            content::differences(&record.manifest, &manifest, NAMED).join(", ")
        } else {
            "its record's manifest does not match its hash".to_owned()
        };
        return Err(format!(
            "its files are not the ones kavi installed on {}: {changed}",
            record.provisioned_at
        ));
    }
    Ok(Held {
        content: hash,
        stamps,
    })
}

/// Removes the record of `folder`, before the folder is made again.
pub fn forget(folder: &Path) -> std::io::Result<()> {
    match std::fs::remove_file(record_path(folder)) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toolchain() -> Toolchain {
        Toolchain {
            name: "python".into(),
            interpreter: "python3".into(),
            packages: [("tool".to_owned(), "1.0".to_owned())].into(),
            libraries: Vec::new(),
            lock: None,
        }
    }

    /// A small environment as venv and pip leave one: a script, a package, the interpreter link.
    fn environment(home: &Path) -> PathBuf {
        let folder = home.join("python-0123");
        let site = folder.join("lib/python3.11/site-packages");
        std::fs::create_dir_all(&site).unwrap();
        std::fs::create_dir_all(folder.join("bin")).unwrap();
        std::fs::write(site.join("tool.py"), "print('tool')\n").unwrap();
        std::fs::write(folder.join("bin/tool"), "#!/bin/python\nimport tool\n").unwrap();
        std::os::unix::fs::symlink("/bin/sh", folder.join("bin/python")).unwrap();
        folder
    }

    #[test]
    fn only_the_recorded_content_at_the_recorded_path_under_this_key_is_held() {
        kavi_journal::keys::use_unit_test_keys();
        let home = tempfile::tempdir().unwrap();
        let folder = environment(home.path());
        let toolchain = toolchain();
        let err = check(&toolchain, &folder).unwrap_err();
        assert!(err.contains("kavi has no record of installing it"), "{err}");

        let held = write(&toolchain, &folder).unwrap();
        let again = check(&toolchain, &folder).unwrap();
        assert_eq!(again.content, held.content);

        // A `.pth` planted among the packages, whatever RECORD would say of it.
        let pth = folder.join("lib/python3.11/site-packages/zz.pth");
        std::fs::write(&pth, "import os\n").unwrap();
        let err = check(&toolchain, &folder).unwrap_err();
        assert!(
            err.contains("`lib/python3.11/site-packages/zz.pth` added"),
            "{err}"
        );
        std::fs::remove_file(&pth).unwrap();
        check(&toolchain, &folder).unwrap();

        // The interpreter link retargeted.
        std::fs::remove_file(folder.join("bin/python")).unwrap();
        std::os::unix::fs::symlink("/bin/true", folder.join("bin/python")).unwrap();
        let err = check(&toolchain, &folder).unwrap_err();
        assert!(err.contains("`bin/python` changed"), "{err}");

        // Another declaration (an edited pin) is not this record's.
        let folder = environment(&home.path().join("again"));
        write(&toolchain, &folder).unwrap();
        let mut other = toolchain.clone();
        other.packages.insert("tool".into(), "1.1".into());
        let err = check(&other, &folder).unwrap_err();
        assert!(err.contains("another declaration"), "{err}");

        // A copy at another path, its record copied and its path edited: the MAC does not hold.
        let copy = home.path().join("copy/python-0123");
        std::fs::create_dir_all(copy.parent().unwrap()).unwrap();
        let copied = std::process::Command::new("cp")
            .arg("-a")
            .arg(&folder)
            .arg(copy.parent().unwrap())
            .status()
            .unwrap();
        assert!(copied.success());
        let text = std::fs::read_to_string(record_path(&folder)).unwrap();
        std::fs::write(record_path(&copy), &text).unwrap();
        let err = check(&toolchain, &copy).unwrap_err();
        assert!(err.contains("not here (a copy)"), "{err}");
        let mut record: Record = serde_json::from_str(&text).unwrap();
        record.path = copy.clone();
        std::fs::write(record_path(&copy), serde_json::to_string(&record).unwrap()).unwrap();
        let err = check(&toolchain, &copy).unwrap_err();
        assert!(
            err.contains("was not made with this account's key"),
            "{err}"
        );
    }
}
