//! Making a toolchain's environment, once, and finding it again.
//!
//! A Python toolchain is a virtual environment made with `<interpreter> -m venv`, given pip by
//! its own `ensurepip` (a step of its own, so that its error reaches the user: `venv` swallows
//! it), into which pip installs the pinned packages (wheels only: no package's build script
//! runs here). Its folder is named by the declaration's hash (see [`super::Toolchain::folder_in`]); a
//! manifest written in it, `kavi-toolchain.json`, says which versions it holds, and kavi's
//! record beside it, written last, what it installed (see [`super::installed`]). A lock file
//! beside the folder lets one kavi process provision while the others wait and then reuse it.
//! A folder without its manifest (an install that was killed), or that is not what the record
//! says kavi installed there, is made again.

use std::collections::BTreeMap;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::Instant;

use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use super::lock::Locked;
use super::{INTERPRETER_TOOL, Toolchain, installed};
use crate::config::ToolchainHome;
use crate::process::{CaptureOptions, CommandSpec, Exit};

/// The file that says an environment is complete.
const MANIFEST: &str = "kavi-toolchain.json";

/// How many lines of a failed step's output an error repeats.
const OUTPUT_LINES: usize = 12;

/// Prints what an environment reports about itself: its Python and each package's version.
const INSPECT: &str = "import importlib.metadata as m, json, platform, sys
found = {}
for p in sys.argv[1:]:
    try:
        found[p] = m.version(p)
    except m.PackageNotFoundError:
        found[p] = None
print(json.dumps({'python': platform.python_version(), 'packages': found}))";

#[derive(Debug, thiserror::Error)]
pub enum ToolchainError {
    #[error(
        "could not provision toolchain `{toolchain}` ({pins}): {reason}\n\
         help: without a reachable package registry, point kavi at an environment that has these \
         versions: in kavi.toml, `[toolchain.{toolchain}]` then `path = \"/path/to/venv\"`"
    )]
    Install {
        toolchain: String,
        pins: String,
        reason: String,
    },
    #[error(
        "toolchain `{toolchain}`: {lock} {reason}; run `kavi toolchain lock` to lock what \
         policies/toolchains.toml pins"
    )]
    Unlocked {
        toolchain: String,
        lock: String,
        reason: &'static str,
    },
    #[error("toolchain `{toolchain}`: the environment {path} (from kavi.toml) {reason}")]
    Existing {
        toolchain: String,
        path: String,
        reason: String,
    },
    #[error(
        "toolchain `{toolchain}`: refusing the environment {path}, its files are not the ones \
         pip installed: {reason}\nhelp: remove {path}; kavi provisions it again from the lock"
    )]
    Tampered {
        toolchain: String,
        path: String,
        reason: String,
    },
    #[error(
        "toolchain `{toolchain}`: the environment {path} is not one this kavi installed ({why}), \
         so its tools are not run; provisioning it again failed: {failure}"
    )]
    Untrusted {
        toolchain: String,
        path: String,
        why: String,
        failure: Box<ToolchainError>,
    },
    #[error("toolchain `{toolchain}`: {context}: {source}")]
    Io {
        toolchain: String,
        context: String,
        source: std::io::Error,
    },
}

/// A toolchain ready to run: where its tools are and which versions they are.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Provisioned {
    pub toolchain: String,
    /// The declaration's hash (see [`Toolchain::hash`]).
    pub hash: String,
    /// The environment's folder.
    pub path: PathBuf,
    /// `provisioned` (by kavi, in its cache) or `existing` (named in kavi.toml).
    pub origin: String,
    /// The environment's Python version.
    pub python: String,
    /// Each package's installed version.
    pub packages: BTreeMap<String, String>,
    /// The hash of the locked set it was installed from (see [`Locked::hash`]); none for an
    /// environment kavi.toml names.
    #[serde(default)]
    pub lock: Option<String>,
    /// `sha256:` of the environment's content manifest when kavi checked it (see
    /// [`kavi_foundation::content::manifest`]): the bytes a gate ran.
    #[serde(default)]
    pub content: Option<String>,
    /// Its stamps when that manifest was taken (see [`kavi_foundation::content::stamps`]): they
    /// must not move while the gates run.
    #[serde(skip)]
    pub stamps: Option<String>,
}

impl Provisioned {
    /// This environment, checked to hold the content `held` names.
    fn held(mut self, held: installed::Held) -> Self {
        self.content = Some(held.content);
        self.stamps = Some(held.stamps);
        self
    }

    /// The executable of `tool` in the environment.
    pub fn tool_path(&self, tool: &str) -> PathBuf {
        self.path.join("bin").join(tool)
    }

    /// The version of `tool`: a package's, or the interpreter's.
    pub fn version_of(&self, tool: &str) -> Option<&str> {
        if tool == INTERPRETER_TOOL {
            Some(&self.python)
        } else {
            self.packages.get(tool).map(String::as_str)
        }
    }

    /// What a gate result records about the tool it ran.
    pub fn record(&self, tool: &str) -> serde_json::Value {
        serde_json::json!({
            "toolchain": self.toolchain,
            "tool": tool,
            "version": self.version_of(tool),
            "hash": self.hash,
            "lock": self.lock,
            "origin": self.origin,
            "content": self.content,
        })
    }
}

/// Reports progress while an environment is made.
pub type Progress<'a> = &'a (dyn Fn(&str) + Sync);

/// The toolchain's environment: the one `kavi.toml` names, else kavi's own, made now if it is
/// not there yet. `progress` hears about an install; a reused environment says nothing.
pub async fn ensure(
    toolchain: &Toolchain,
    home: &ToolchainHome,
    options: &CaptureOptions,
    cancel: &CancellationToken,
    progress: Progress<'_>,
) -> Result<Provisioned, ToolchainError> {
    if let Some(path) = toolchain.existing_in(home) {
        return existing(toolchain, path, options, cancel).await;
    }
    // kavi installs only a locked set, made for the pins declared now.
    let locked = Locked::matching(toolchain).ok_or_else(|| ToolchainError::Unlocked {
        toolchain: toolchain.name.clone(),
        lock: super::lock::DEFAULT_LOCK.to_owned(),
        reason: if toolchain.lock.is_some() {
            "was locked for other pins than it declares"
        } else {
            "has no entry for it (or there is no lock)"
        },
    })?;
    let io = |context: String| {
        let toolchain = toolchain.name.clone();
        move |source| ToolchainError::Io {
            toolchain,
            context,
            source,
        }
    };
    let folder = toolchain
        .folder_in(home)
        .map_err(|e| io("cannot name its folder".into())(std::io::Error::other(e)))?;
    // A home or environment another account may write could change between the check and a
    // gate's run.
    kavi_foundation::sandbox::state_folder(&home.cache)
        .map_err(io(format!("cannot use {}", home.cache.display())))?;
    let lock_path = folder.with_extension("lock");
    // Closed to every other account (flock needs only a descriptor opened for reading: a
    // reader could hold it and keep every kavi waiting to provision); one an older kavi made
    // readable is closed too.
    let lock = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .open(&lock_path)
        .and_then(|lock| {
            kavi_foundation::sandbox::close_to_readers(&lock_path)?;
            Ok(lock)
        })
        .map_err(io(format!("cannot create {}", lock_path.display())))?;
    // Another kavi may be provisioning the same declaration: wait for it, then reuse its work.
    let lock = tokio::task::spawn_blocking(move || lock.lock().map(|()| lock))
        .await
        .map_err(|e| io("waiting for the lock".into())(std::io::Error::other(e)))?
        .map_err(io(format!("cannot lock {}", lock_path.display())))?;
    let mut refused = None;
    if let Some(ready) = read_manifest(toolchain, &folder) {
        match held(toolchain, &folder) {
            Ok(held) => return Ok(ready.held(held)),
            Err(why) => {
                progress(&format!(
                    "toolchain `{}`: {} is not the environment kavi installed ({why}); \
                     provisioning it again",
                    toolchain.name,
                    folder.display()
                ));
                refused = Some(why);
            }
        }
    }
    let started = Instant::now();
    progress(&format!(
        "provisioning toolchain `{}` ({}) into {} ...",
        toolchain.name,
        toolchain.describe_pins(),
        folder.display()
    ));
    installed::forget(&folder).map_err(io("cannot remove its old record".into()))?;
    let installed = install(toolchain, locked, &folder, options, cancel).await;
    if installed.is_err() {
        let _ = std::fs::remove_dir_all(&folder);
    }
    let mut provisioned = installed.map_err(|failure| match refused {
        Some(why) => ToolchainError::Untrusted {
            toolchain: toolchain.name.clone(),
            path: folder.display().to_string(),
            why,
            failure: Box::new(failure),
        },
        None => failure,
    })?;
    provisioned.origin = "provisioned".into();
    let text = serde_json::to_string_pretty(&provisioned).expect("a manifest serializes");
    let temp = folder.join(format!("{MANIFEST}.partial"));
    std::fs::write(&temp, text)
        .and_then(|()| std::fs::rename(&temp, folder.join(MANIFEST)))
        .map_err(io("cannot write its manifest".into()))?;
    kavi_foundation::sandbox::state_folder(&folder)
        .map_err(io(format!("cannot use {}", folder.display())))?;
    // Recorded last, as pip left it: from now on the environment is held to this.
    let held = installed::write(toolchain, &folder)
        .map_err(|e| io("cannot record what was installed".into())(std::io::Error::other(e)))?;
    drop(lock);
    progress(&format!(
        "toolchain `{}` ready in {:.1}s",
        toolchain.name,
        started.elapsed().as_secs_f64()
    ));
    Ok(provisioned.held(held))
}

/// The environment at `folder`, if no other account may write it and it is what kavi recorded
/// installing there (see [`installed::check`]).
pub fn held(toolchain: &Toolchain, folder: &Path) -> Result<installed::Held, String> {
    kavi_foundation::sandbox::state_folder(folder).map_err(|e| e.to_string())?;
    installed::check(toolchain, folder)
}

/// `provisioned` (an environment kavi.toml names), once its files are checked against what pip
/// installed (see [`super::record`]): its versions alone do not say its tools were not replaced.
fn verified(
    toolchain: &Toolchain,
    provisioned: Provisioned,
) -> Result<Provisioned, ToolchainError> {
    match super::record::verify(&provisioned.path) {
        Ok(()) => Ok(provisioned),
        Err(reason) => Err(ToolchainError::Tampered {
            toolchain: toolchain.name.clone(),
            path: provisioned.path.display().to_string(),
            reason,
        }),
    }
}

/// The manifest of a complete environment of this declaration, if there is one and its tools
/// are still in place.
pub fn read_manifest(toolchain: &Toolchain, folder: &Path) -> Option<Provisioned> {
    let text = std::fs::read_to_string(folder.join(MANIFEST)).ok()?;
    let provisioned: Provisioned = serde_json::from_str(&text).ok()?;
    let complete = provisioned.hash == toolchain.hash()
        && provisioned.path == folder
        && toolchain
            .tools()
            .all(|tool| provisioned.tool_path(tool).is_file());
    complete.then_some(provisioned)
}

/// What every pip install of kavi's takes: wheels only (no package's build script runs), and
/// bounded retries.
pub(super) const PIP_OPTIONS: [&str; 7] = [
    "--no-input",
    "--disable-pip-version-check",
    "--only-binary=:all:",
    "--retries",
    "2",
    "--timeout",
    "20",
];

/// Makes a bare environment of `toolchain`'s interpreter in `folder`, with pip; its python.
pub(super) async fn make_environment(
    toolchain: &Toolchain,
    folder: &Path,
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let folder_arg = folder.display().to_string();
    step(
        &toolchain.interpreter,
        &["-m", "venv", "--without-pip", &folder_arg],
        options,
        cancel,
    )
    .await
    .map_err(|e| format!("`{} -m venv` failed: {e}", toolchain.interpreter))?;
    let python = folder.join("bin").join("python").display().to_string();
    step(
        &python,
        &["-m", "ensurepip", "--default-pip"],
        options,
        cancel,
    )
    .await
    .map_err(|e| format!("the environment could not be given pip: {e}"))?;
    Ok(python)
}

/// Makes the environment in `folder` (removing what an earlier attempt left) from the locked
/// set, and checks it.
async fn install(
    toolchain: &Toolchain,
    locked: &Locked,
    folder: &Path,
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> Result<Provisioned, ToolchainError> {
    let failed = |reason: String| ToolchainError::Install {
        toolchain: toolchain.name.clone(),
        pins: toolchain.describe_pins(),
        reason,
    };
    if folder.exists() {
        std::fs::remove_dir_all(folder).map_err(|e| {
            failed(format!(
                "cannot remove the unfinished {}: {e}",
                folder.display()
            ))
        })?;
    }
    let python = make_environment(toolchain, folder, options, cancel)
        .await
        .map_err(failed)?;
    // The locked set, each wheel checked against its hash, and nothing else.
    let requirements = folder.join("kavi-requirements.txt");
    std::fs::write(&requirements, locked.requirements().join("\n") + "\n")
        .map_err(|e| failed(format!("cannot write {}: {e}", requirements.display())))?;
    let requirements_arg = requirements.display().to_string();
    let mut args = vec!["-m", "pip", "install", "--require-hashes", "--no-deps"];
    args.extend(PIP_OPTIONS);
    args.extend(["-r", &requirements_arg]);
    step(&python, &args, options, cancel)
        .await
        .map_err(|e| failed(format!("pip could not install the locked set: {e}")))?;
    let mut provisioned = inspect(toolchain, folder, options, cancel)
        .await
        .map_err(failed)?;
    check_pins(toolchain, &provisioned).map_err(failed)?;
    provisioned.lock = Some(locked.hash());
    Ok(provisioned)
}

/// An environment named in kavi.toml: used as it is, if it holds the pinned versions.
async fn existing(
    toolchain: &Toolchain,
    path: &Path,
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> Result<Provisioned, ToolchainError> {
    let refused = |reason: String| ToolchainError::Existing {
        toolchain: toolchain.name.clone(),
        path: path.display().to_string(),
        reason,
    };
    let mut provisioned = inspect(toolchain, path, options, cancel)
        .await
        .map_err(refused)?;
    provisioned.origin = "existing".into();
    check_pins(toolchain, &provisioned).map_err(refused)?;
    for tool in toolchain.tools() {
        if !provisioned.tool_path(tool).is_file() {
            return Err(refused(format!("has no bin/{tool}")));
        }
    }
    verified(toolchain, provisioned)
}

/// Asks the environment's interpreter for its versions.
async fn inspect(
    toolchain: &Toolchain,
    folder: &Path,
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> Result<Provisioned, String> {
    let python = folder.join("bin").join("python");
    if !python.is_file() {
        return Err(format!("has no interpreter at {}", python.display()));
    }
    let python = python.display().to_string();
    let mut args = vec!["-I", "-c", INSPECT];
    args.extend(toolchain.packages.keys().map(String::as_str));
    let output = step(&python, &args, options, cancel).await?;
    #[derive(Deserialize)]
    struct Found {
        python: String,
        packages: BTreeMap<String, Option<String>>,
    }
    let found: Found = serde_json::from_str(output.trim())
        .map_err(|e| format!("its interpreter answered what kavi cannot read ({e}): {output}"))?;
    Ok(Provisioned {
        toolchain: toolchain.name.clone(),
        hash: toolchain.hash(),
        path: folder.to_owned(),
        origin: String::new(),
        python: found.python,
        lock: None,
        content: None,
        stamps: None,
        packages: found
            .packages
            .into_iter()
            .map(|(package, version)| (package, version.unwrap_or_default()))
            .collect(),
    })
}

/// Refuses an environment whose versions are not the pinned ones.
fn check_pins(toolchain: &Toolchain, provisioned: &Provisioned) -> Result<(), String> {
    let wrong: Vec<String> = toolchain
        .packages
        .iter()
        .filter_map(|(package, pinned)| {
            let found = provisioned.packages.get(package).map_or("", String::as_str);
            (!found.eq_ignore_ascii_case(pinned)).then(|| {
                if found.is_empty() {
                    format!("{package} is not installed (pinned {pinned})")
                } else {
                    format!("{package} is {found}, pinned {pinned}")
                }
            })
        })
        .collect();
    if wrong.is_empty() {
        Ok(())
    } else {
        Err(format!("holds other versions: {}", wrong.join("; ")))
    }
}

/// Runs one step of making or reading an environment, with kavi's own environment (pip needs
/// its proxy and index settings); returns its stdout, or the end of its output when it fails.
pub(super) async fn step(
    program: &str,
    args: &[&str],
    options: &CaptureOptions,
    cancel: &CancellationToken,
) -> Result<String, String> {
    let spec = CommandSpec {
        program: program.to_owned(),
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        env: std::env::vars().collect(),
        cwd: std::env::temp_dir(),
        stdin: None,
        confinement: None,
    };
    let finished = crate::process::run(&spec, options, cancel)
        .await
        .map_err(|e| e.to_string())?;
    let stdout = String::from_utf8_lossy(&finished.stdout.head).into_owned();
    match finished.exit {
        Exit::Code(0) => Ok(stdout),
        exit => {
            let output = format!("{stdout}{}", String::from_utf8_lossy(&finished.stderr.head));
            let summary = failure_summary(&output);
            let how = match exit {
                Exit::Code(code) => format!("exited with code {code}"),
                Exit::Signal(signal) => format!("was killed by signal {signal}"),
                Exit::Cancelled => "was cancelled".to_owned(),
            };
            Err(format!("{how}\n    {summary}"))
        }
    }
}

/// What of a failed step's output says why: pip's `ERROR:` lines when it printed any (a
/// traceback after them only says that a subprocess failed), else the last lines.
fn failure_summary(output: &str) -> String {
    let lines: Vec<&str> = output.lines().filter(|l| !l.trim().is_empty()).collect();
    let errors: Vec<&str> = lines
        .iter()
        .copied()
        .filter(|line| line.starts_with("ERROR:"))
        .collect();
    let chosen = if errors.is_empty() { &lines } else { &errors };
    chosen[chosen.len().saturating_sub(OUTPUT_LINES)..].join("\n    ")
}

#[cfg(test)]
mod tests {
    use super::failure_summary;

    #[test]
    fn pips_error_lines_are_the_summary_not_the_traceback_after_them() {
        // What `python -m ensurepip` printed on a full disk (abridged).
        let output = "Looking in links: /tmp/tmpv9ox301z\n\
            Processing /tmp/tmpv9ox301z/setuptools-65.5.0-py3-none-any.whl\n\
            ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device\n\
            \n\
            Traceback (most recent call last):\n  File \"<frozen runpy>\", line 198, in _run_module_as_main\n\
            subprocess.CalledProcessError: Command '['/v/bin/python', '-c', '...']' returned non-zero exit status 1.\n";
        assert_eq!(
            failure_summary(output),
            "ERROR: Could not install packages due to an OSError: [Errno 28] No space left on device"
        );
    }

    #[test]
    fn without_error_lines_the_last_lines_are_the_summary() {
        let output: String = (1..=20).map(|i| format!("line {i}\n\n")).collect();
        let expected: Vec<String> = (9..=20).map(|i| format!("line {i}")).collect();
        assert_eq!(failure_summary(&output), expected.join("\n    "));
    }
}
