//! Toolchains: the tools gates run, declared with pinned versions and provisioned by kavi.
//!
//! `policies/toolchains.toml` declares each toolchain: the interpreter its environment is made
//! from and every package pinned to one exact version. As pre-commit does for its hooks, kavi
//! makes the environment on first use (a Python virtual environment, see [`provision`]), under
//! its cache folder, in a folder named by the hash of the declaration: later runs reuse it, and
//! an edited declaration gets a fresh one. A gate that names a toolchain runs the tool from that
//! environment, never whatever PATH holds, and its result records the tool's version.
//!
//! Where no registry is reachable, `[toolchain.NAME] path = "..."` in `kavi.toml` points kavi at
//! an existing environment instead; its versions must still be the pinned ones.

pub mod installed;
pub mod lock;
pub mod provision;
pub mod record;

use kavi_foundation::diagnostic;
use kavi_process as process;
use kavi_spec::config;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use indexmap::IndexMap;
use serde::Deserialize;
use sha2::{Digest, Sha256};
use toml::Spanned;

use crate::config::ToolchainHome;
use crate::diagnostic::{Diagnostic, SourceFile};

pub use provision::{Provisioned, ToolchainError};

pub const DEFAULT_POLICY: &str = "policies/toolchains.toml";

/// The tool every Python toolchain has besides its packages: the environment's interpreter.
pub const INTERPRETER_TOOL: &str = "python";

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RawSet {
    #[serde(default)]
    #[schemars(with = "IndexMap<String, RawToolchain>")]
    toolchain: IndexMap<String, Spanned<RawToolchain>>,
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
struct RawToolchain {
    /// The interpreter the environment is made from: a name on PATH or an absolute path.
    #[serde(default = "default_interpreter")]
    interpreter: String,
    /// Package name to exact version.
    #[schemars(with = "IndexMap<String, String>")]
    packages: IndexMap<String, Spanned<String>>,
    /// Packages of `packages` that install no program of their own (a pytest plugin): pinned
    /// and installed like the others, never run as a tool.
    #[serde(default)]
    #[schemars(with = "Vec<String>")]
    libraries: Vec<Spanned<String>>,
}

fn default_interpreter() -> String {
    "python3".to_owned()
}

/// One declared toolchain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Toolchain {
    pub name: String,
    pub interpreter: String,
    /// Package name to its pinned version, as declared.
    pub packages: BTreeMap<String, String>,
    /// The packages that are not tools (see `libraries` in the policy).
    pub libraries: Vec<String>,
    /// Its entry in the lock file beside the declarations, when there is one.
    pub lock: Option<lock::Locked>,
}

impl Toolchain {
    /// The folder its environment is provisioned into under `home`: named by its declaration's
    /// hash, so each declaration has its own, and by the key kavi records what it installed
    /// under (see [`installed`]). An environment is trusted only under the key that recorded it,
    /// so workspaces with keys of their own (`KAVI_KEYS`) sharing a cache each have theirs, and
    /// none provisions over another's while its gates run.
    pub fn folder_in(&self, home: &ToolchainHome) -> Result<PathBuf, String> {
        let mut hasher = Sha256::new();
        hasher.update(self.hash().as_bytes());
        hasher.update(b"\n");
        hasher.update(installed::key_name()?.as_bytes());
        let digest = format!("{:x}", hasher.finalize());
        Ok(home.cache.join(format!("{}-{}", self.name, &digest[..16])))
    }

    /// The existing environment `kavi.toml` names for it, if any.
    pub fn existing_in<'h>(&self, home: &'h ToolchainHome) -> Option<&'h Path> {
        home.existing.get(&self.name).map(PathBuf::as_path)
    }

    /// `sha256:<hex>` over what makes the environment: the interpreter, the pins and the
    /// locked set. The environment's folder is named by it, so an edited declaration or a new
    /// lock gets a fresh one.
    pub fn hash(&self) -> String {
        let mut hasher = Sha256::new();
        hasher.update(b"kavi-toolchain-v2\npython\n");
        hasher.update(self.interpreter.as_bytes());
        for (package, version) in &self.packages {
            hasher.update(format!("\n{package}=={version}").as_bytes());
        }
        if let Some(locked) = &self.lock {
            hasher.update(b"\nlock\n");
            hasher.update(locked.hash().as_bytes());
        }
        format!("sha256:{:x}", hasher.finalize())
    }

    /// `sha256:<hex>` over the pins alone: what a lock entry was made for.
    pub fn pins_hash(&self) -> String {
        let mut hasher = Sha256::new();
        for (package, version) in &self.packages {
            hasher.update(format!("{package}=={version}\n").as_bytes());
        }
        format!("sha256:{:x}", hasher.finalize())
    }

    /// The tools a gate may name: each package, and the environment's interpreter.
    pub fn tools(&self) -> impl Iterator<Item = &str> {
        std::iter::once(INTERPRETER_TOOL).chain(
            self.packages
                .keys()
                .map(String::as_str)
                .filter(|package| !self.libraries.iter().any(|l| l == package)),
        )
    }

    pub fn has_tool(&self, tool: &str) -> bool {
        self.tools().any(|t| t == tool)
    }

    /// The pins as pip takes them: `name==version`.
    pub fn requirements(&self) -> Vec<String> {
        self.packages
            .iter()
            .map(|(package, version)| format!("{package}=={version}"))
            .collect()
    }

    /// The pins for people: `ruff 0.17.6, mypy 2.4.1`.
    pub fn describe_pins(&self) -> String {
        self.packages
            .iter()
            .map(|(package, version)| format!("{package} {version}"))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// `policies/toolchains.toml`, parsed and checked.
#[derive(Debug, Clone)]
pub struct ToolchainSet {
    pub toolchains: Vec<Arc<Toolchain>>,
    pub source: Arc<SourceFile>,
}

impl ToolchainSet {
    pub fn parse(source: &Arc<SourceFile>) -> Result<Self, Diagnostic> {
        let raw: RawSet =
            toml::from_str(&source.text).map_err(|e| crate::diagnostic::toml_error(source, &e))?;
        let mut toolchains = Vec::new();
        for (name, declared) in raw.toolchain {
            let at = |message: String, span: std::ops::Range<usize>| {
                Diagnostic::new(message).at(source, span)
            };
            if !is_name(&name) {
                return Err(at(
                    format!(
                        "toolchain name `{name}`: use lowercase letters, digits, `-` and `_`, \
                         starting with a letter"
                    ),
                    declared.span(),
                ));
            }
            let span = declared.span();
            let declared = declared.into_inner();
            if declared.packages.is_empty() {
                return Err(at(
                    format!("toolchain `{name}` declares no packages"),
                    span.clone(),
                ));
            }
            let mut packages = BTreeMap::new();
            for (package, version) in declared.packages {
                if !is_package_name(&package) {
                    return Err(at(
                        format!("`{package}` is not a package name"),
                        version.span(),
                    ));
                }
                if !is_exact_version(version.get_ref()) {
                    return Err(at(
                        format!(
                            "`{package}` = \"{}\" is not one exact version: pin it, as in \
                             `{package} = \"1.2.3\"`, so that an upgrade never changes a gate \
                             silently",
                            version.get_ref()
                        ),
                        version.span(),
                    ));
                }
                if package == INTERPRETER_TOOL {
                    return Err(at(
                        format!(
                            "`{INTERPRETER_TOOL}` is the environment's interpreter, not a package"
                        ),
                        version.span(),
                    ));
                }
                packages.insert(package, version.into_inner());
            }
            for library in &declared.libraries {
                if !packages.contains_key(library.get_ref()) {
                    return Err(at(
                        format!(
                            "library `{}` is not one of toolchain `{name}`'s packages",
                            library.get_ref()
                        ),
                        library.span(),
                    ));
                }
            }
            toolchains.push(Arc::new(Toolchain {
                name,
                interpreter: declared.interpreter,
                packages,
                libraries: declared
                    .libraries
                    .into_iter()
                    .map(Spanned::into_inner)
                    .collect(),
                lock: None,
            }));
        }
        Ok(Self {
            toolchains,
            source: Arc::clone(source),
        })
    }

    /// Gives each toolchain its entry of the lock file (`lock`: its text, when there is one).
    /// An entry that is malformed is refused here; one that is missing or made for other pins
    /// is refused when kavi provisions from it (an environment kavi.toml names needs none).
    pub fn with_lock(mut self, lock: Option<&Arc<SourceFile>>) -> Result<Self, Diagnostic> {
        let Some(lock) = lock else { return Ok(self) };
        let mut entries = lock::parse(lock)?;
        for toolchain in &mut self.toolchains {
            if let Some(locked) = entries.remove(&toolchain.name) {
                Arc::make_mut(toolchain).lock = Some(locked);
            }
        }
        Ok(self)
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Toolchain>> {
        self.toolchains.iter().find(|t| t.name == name)
    }

    /// The toolchains' names, for an error that lists them.
    pub fn names(&self) -> String {
        let names: Vec<&str> = self.toolchains.iter().map(|t| t.name.as_str()).collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    }
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_lowercase())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '_')
}

fn is_package_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// One release, as pip's `==` takes it: no ranges, wildcards or spaces.
fn is_exact_version(version: &str) -> bool {
    version.chars().next().is_some_and(|c| c.is_ascii_digit())
        && version
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '+' | '!' | '-'))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ToolchainSet, String> {
        ToolchainSet::parse(&SourceFile::new("policies/toolchains.toml", text))
            .map_err(|d| d.to_string())
    }

    #[test]
    fn pins_are_exact_and_the_hash_follows_the_declaration() {
        let set = parse("[toolchain.python]\npackages = { ruff = \"0.17.6\", mypy = \"2.4.1\" }\n")
            .unwrap();
        let python = set.get("python").unwrap();
        assert_eq!(python.interpreter, "python3");
        assert_eq!(python.requirements(), ["mypy==2.4.1", "ruff==0.17.6"]);
        assert!(python.has_tool("ruff") && python.has_tool("python") && !python.has_tool("black"));
        let upgraded =
            parse("[toolchain.python]\npackages = { ruff = \"0.17.7\", mypy = \"2.4.1\" }\n")
                .unwrap();
        assert_ne!(python.hash(), upgraded.get("python").unwrap().hash());
        let reordered =
            parse("[toolchain.python]\npackages = { mypy = \"2.4.1\", ruff = \"0.17.6\" }\n")
                .unwrap();
        assert_eq!(python.hash(), reordered.get("python").unwrap().hash());

        for (bad, says) in [
            ("ruff = \">=0.17\"", "is not one exact version"),
            ("ruff = \"latest\"", "is not one exact version"),
            ("ruff = \"0.17 ; rm -rf /\"", "is not one exact version"),
            ("\"-e git+https://x\" = \"1\"", "is not a package name"),
            ("python = \"3.11\"", "the environment's interpreter"),
        ] {
            let error =
                parse(&format!("[toolchain.python]\npackages = {{ {bad} }}\n")).unwrap_err();
            assert!(error.contains(says), "{bad}: {error}");
            assert!(error.contains("policies/toolchains.toml:2:"), "{error}");
        }
        assert!(
            parse("[toolchain.python]\npackages = {}\n")
                .unwrap_err()
                .contains("declares no packages")
        );
    }
}
