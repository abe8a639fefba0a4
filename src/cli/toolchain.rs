//! `kavi toolchain install|lock|list|path`: the toolchains gates run
//! (`policies/toolchains.toml`), locked, provisioned ahead of a run or inspected.

use serde_json::json;

use super::output::table;
use crate::config::Workspace;
use crate::error::{Error, exit};
use crate::process::CaptureOptions;
use crate::spec::SpecError;
use crate::toolchains::lock::{self, DEFAULT_LOCK};
use crate::toolchains::{
    DEFAULT_POLICY, Provisioned, Toolchain, ToolchainSet, installed, provision,
};

/// The workspace's declared toolchains, each with its entry of the lock when there is one.
pub(super) fn load(workspace: &Workspace) -> Result<ToolchainSet, Error> {
    let source = super::read_policy(workspace, DEFAULT_POLICY)?;
    let lock = if workspace.root.join(DEFAULT_LOCK).is_file() {
        Some(super::read_policy(workspace, DEFAULT_LOCK)?)
    } else {
        None
    };
    Ok(ToolchainSet::parse(&source)
        .and_then(|set| set.with_lock(lock.as_ref()))
        .map_err(SpecError::from)?)
}

fn capture() -> CaptureOptions {
    CaptureOptions {
        limit: 1024 * 1024,
        spill_dir: std::env::temp_dir(),
        roster: None,
        live: None,
    }
}

/// Resolves every declared toolchain with pip and writes the lock beside the declarations.
pub async fn lock(workspace: &Workspace) -> Result<i32, Error> {
    let set = load(workspace)?;
    let cancel = super::cancel_on_signals("locking");
    let mut entries = std::collections::BTreeMap::new();
    for toolchain in &set.toolchains {
        errln!(
            "resolving toolchain `{}` ({}) ...",
            toolchain.name,
            toolchain.describe_pins()
        );
        let locked = lock::resolve(toolchain, &capture(), &cancel).await?;
        outln!(
            "{}  {} packages  {}",
            toolchain.name,
            locked.package.len(),
            locked.hash()
        );
        entries.insert(toolchain.name.clone(), locked);
    }
    let path = workspace.root.join(DEFAULT_LOCK);
    std::fs::write(&path, lock::render(DEFAULT_POLICY, &entries)).map_err(|source| Error::Io {
        context: format!("cannot write {}", path.display()),
        source,
    })?;
    outln!("wrote {DEFAULT_LOCK}");
    Ok(exit::SUCCESS)
}

/// The declared toolchain `name`, or all of them.
fn chosen<'a>(set: &'a ToolchainSet, name: Option<&str>) -> Result<Vec<&'a Toolchain>, Error> {
    match name {
        None => Ok(set.toolchains.iter().map(AsRef::as_ref).collect()),
        Some(name) => set.get(name).map(|t| vec![t.as_ref()]).ok_or_else(|| {
            Error::NotFound(format!(
                "{DEFAULT_POLICY} declares no toolchain `{name}` (declared: {})",
                set.names()
            ))
        }),
    }
}

/// Provisions the toolchains now (or checks the environments kavi.toml names), so that the
/// first run does not wait for them.
pub async fn install(workspace: &Workspace, name: Option<&str>, json: bool) -> Result<i32, Error> {
    let set = load(workspace)?;
    let home = crate::config::ToolchainHome::of(workspace);
    let options = capture();
    let cancel = super::cancel_on_signals("provisioning");
    let mut ready = Vec::new();
    for toolchain in chosen(&set, name)? {
        let provisioned = provision::ensure(toolchain, &home, &options, &cancel, &|line| {
            errln!("{line}")
        })
        .await?;
        if !json {
            outln!(
                "{}  {}  {}",
                toolchain.name,
                describe_versions(&provisioned),
                provisioned.path.display()
            );
        }
        ready.push(provisioned);
    }
    if json {
        super::print_json(&ready);
    }
    Ok(exit::SUCCESS)
}

/// Each declared toolchain: its pins, whether and where its environment is, and whether it is
/// the one kavi recorded installing there.
pub fn list(workspace: &Workspace, json: bool) -> Result<i32, Error> {
    let set = load(workspace)?;
    let home = crate::config::ToolchainHome::of(workspace);
    let listed: Vec<serde_json::Value> = set
        .toolchains
        .iter()
        .map(|toolchain| {
            let (mut error, mut untrusted) = (None, None);
            let (state, path, content) = match toolchain.existing_in(&home) {
                Some(path) => ("existing", Some(path.to_owned()), None),
                None => match installed_state(toolchain, &home) {
                    Installed::Missing => ("not provisioned", None, None),
                    Installed::Unknown(why) => {
                        error = Some(why);
                        ("unknown", None, None)
                    }
                    Installed::Found(folder, Ok(held)) => {
                        ("provisioned", Some(folder), Some(held.content))
                    }
                    Installed::Found(folder, Err(why)) => {
                        untrusted = Some(why);
                        ("untrusted", Some(folder), None)
                    }
                },
            };
            json!({
                "name": toolchain.name,
                "interpreter": toolchain.interpreter,
                "packages": toolchain.packages,
                "hash": toolchain.hash(),
                "state": state,
                "path": path,
                "content": content,
                "untrusted": untrusted,
                "error": error,
            })
        })
        .collect();
    if json {
        super::print_json(&listed);
        return Ok(exit::SUCCESS);
    }
    let mut rows = vec![
        ["TOOLCHAIN", "PINS", "STATE", "PATH"]
            .map(String::from)
            .to_vec(),
    ];
    for (toolchain, entry) in set.toolchains.iter().zip(&listed) {
        rows.push(vec![
            toolchain.name.clone(),
            toolchain.describe_pins(),
            entry["state"].as_str().unwrap_or_default().to_owned(),
            entry["path"].as_str().unwrap_or("-").to_owned(),
        ]);
    }
    out!("{}", table(&rows));
    for entry in &listed {
        let name = entry["name"].as_str().unwrap_or_default();
        if let Some(why) = entry["error"].as_str() {
            outln!("{name}: {why}");
        }
        if let Some(why) = entry["untrusted"].as_str() {
            outln!(
                "{name}: not the environment kavi installed ({why}); the next run provisions it \
                 again"
            );
        }
    }
    Ok(exit::SUCCESS)
}

/// What kavi's cache holds for a toolchain (see `kavi_toolchains::installed`).
pub(super) enum Installed {
    /// No environment is provisioned for it.
    Missing,
    /// Its folder cannot be named (the folder's name holds the journal key's name): why.
    Unknown(String),
    /// The environment's folder, and whether it is the one kavi recorded installing there.
    Found(std::path::PathBuf, Result<installed::Held, String>),
}

/// The provisioned environment of `toolchain` in `home`.
pub(super) fn installed_state(
    toolchain: &Toolchain,
    home: &crate::config::ToolchainHome,
) -> Installed {
    let folder = match toolchain.folder_in(home) {
        Ok(folder) => folder,
        Err(why) => return Installed::Unknown(format!("cannot name its folder: {why}")),
    };
    match provision::read_manifest(toolchain, &folder) {
        None => Installed::Missing,
        Some(ready) => {
            let held = provision::held(toolchain, &ready.path);
            Installed::Found(ready.path, held)
        }
    }
}

/// Prints the folder of a toolchain's environment (its tools are in `bin/`), if it is ready.
pub fn path(workspace: &Workspace, name: &str) -> Result<i32, Error> {
    let set = load(workspace)?;
    let home = crate::config::ToolchainHome::of(workspace);
    let toolchain = chosen(&set, Some(name))?[0];
    let path = match toolchain.existing_in(&home) {
        Some(path) => path.to_owned(),
        None => match installed_state(toolchain, &home) {
            Installed::Found(path, Ok(_)) => path,
            Installed::Found(path, Err(why)) => {
                return Err(Error::NotFound(format!(
                    "toolchain `{name}`: {} is not the environment kavi installed ({why}): \
                     `kavi toolchain install {name}` provisions it again (the first run that \
                     needs it does too)",
                    path.display()
                )));
            }
            Installed::Unknown(why) => {
                return Err(Error::Unusable(format!("toolchain `{name}`: {why}")));
            }
            Installed::Missing => {
                return Err(Error::NotFound(format!(
                    "toolchain `{name}` is not provisioned yet: `kavi toolchain install {name}` \
                     makes it (the first run that needs it does too)"
                )));
            }
        },
    };
    outln!("{}", path.display());
    Ok(exit::SUCCESS)
}

/// `ruff 0.17.6, mypy 2.4.1, python 3.11.7`.
fn describe_versions(provisioned: &Provisioned) -> String {
    provisioned
        .packages
        .iter()
        .map(|(package, version)| format!("{package} {version}"))
        .chain(std::iter::once(format!("python {}", provisioned.python)))
        .collect::<Vec<_>>()
        .join(", ")
}
