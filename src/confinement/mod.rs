//! Confinement: the kernel's limits on what a process kavi starts for a role may touch.
//!
//! A role's profile (`policies/confinement.toml`) says which paths may be read, which may be
//! written, and whether TCP may be used. kavi turns it into a Landlock ruleset in its own process
//! ([`prepare`]), and the one place that spawns processes applies it in the child between fork
//! and exec ([`restrict_child`]): `PR_SET_NO_NEW_PRIVS`, then `landlock_restrict_self`. Only
//! those two system calls run in the child, since after a fork in a multi-threaded program
//! nothing that allocates or locks is safe. A violation is then an ordinary `EACCES` inside the
//! child, which fails its node.
//!
//! Where the kernel cannot enforce a profile, the profile's `require` decides: refuse to run the
//! role, naming what is missing, or run it unconfined and record `none`.

pub mod policy;

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::sync::Arc;

use landlock::{
    ABI, Access, AccessFs, AccessNet, CompatLevel, Compatible, PathBeneath, PathFd, Ruleset,
    RulesetAttr, RulesetCreatedAttr,
};
use serde::Serialize;

/// The file-system rights kavi handles, from Landlock ABI 3 (which adds truncation). Anything not
/// granted by a rule is denied.
const FS_ABI: ABI = ABI::V3;

/// TCP bind and connect rules arrived with Landlock ABI 4.
const NET_ABI: i32 = 4;

/// What one role's process may touch, with every path resolved.
#[derive(Debug, Clone, Serialize)]
pub struct Profile {
    pub role: String,
    pub read: Vec<PathBuf>,
    pub write: Vec<PathBuf>,
    /// Whether TCP connect and bind are allowed.
    pub network: bool,
    /// Refuse to run the role where the kernel cannot enforce the profile.
    pub require: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum ConfinementError {
    #[error(
        "refusing to run the {role} unconfined: {missing} (policies/confinement.toml requires \
         confinement; set `require = false` for the role to run it unconfined instead)"
    )]
    Unsupported { role: String, missing: String },
    #[error("failed to prepare the {role}'s confinement for {}: {reason}", path.display())]
    Path {
        role: String,
        path: PathBuf,
        reason: String,
    },
    #[error("failed to prepare the {role}'s confinement: {reason}")]
    Ruleset { role: String, reason: String },
}

/// The Landlock ABI version this kernel offers (0: none).
pub fn kernel_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: u32 = 1;
    // SAFETY: with a null attribute and size 0, this call only reports the ABI version.
    let version = unsafe {
        nix::libc::syscall(
            nix::libc::SYS_landlock_create_ruleset,
            std::ptr::null::<u8>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    i32::try_from(version).unwrap_or(0).max(0)
}

/// A policy file, as the ledger names it: its path and `sha256:` hash (the text is among the
/// stored specs, `kavi spec show <hash>`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PolicyRef {
    pub path: String,
    pub hash: String,
}

/// A profile made ready for a child process, or the decision to run it unconfined.
#[derive(Debug, Clone)]
pub struct Confinement {
    pub profile: Profile,
    /// The policy the profile comes from.
    pub policy: Option<PolicyRef>,
    /// The Landlock ruleset to apply in the child; `None` when running unconfined.
    ruleset: Option<Arc<OwnedFd>>,
    /// Why the process runs unconfined, when it does.
    pub unconfined_because: Option<String>,
    pub abi: i32,
}

impl Confinement {
    /// The ruleset's descriptor, for [`restrict_child`].
    pub fn ruleset_fd(&self) -> Option<RawFd> {
        self.ruleset.as_ref().map(|fd| fd.as_raw_fd())
    }

    /// What the ledger records of this confinement.
    pub fn record(&self) -> serde_json::Value {
        serde_json::json!({
            "role": self.profile.role,
            "enforced": if self.ruleset.is_some() {
                format!("landlock (ABI {})", self.abi)
            } else {
                "none".to_owned()
            },
            "unconfined_because": self.unconfined_because,
            "read": self.profile.read,
            "write": self.profile.write,
            "network": self.profile.network,
            "policy": self.policy.as_ref().map(|p| &p.path),
            "policy_hash": self.policy.as_ref().map(|p| &p.hash),
        })
    }
}

/// Builds the Landlock ruleset for `profile` in this process.
pub fn prepare(profile: Profile) -> Result<Confinement, ConfinementError> {
    prepare_for(profile, kernel_abi())
}

/// [`prepare`] for a kernel offering Landlock ABI `abi`.
fn prepare_for(profile: Profile, abi: i32) -> Result<Confinement, ConfinementError> {
    let role = profile.role.clone();
    let missing = if abi == 0 {
        Some("this kernel has no Landlock".to_owned())
    } else if abi < FS_ABI as i32 {
        Some(format!(
            "Landlock ABI {} is needed for file rules and the kernel has ABI {abi}",
            FS_ABI as i32
        ))
    } else if !profile.network && abi < NET_ABI {
        Some(format!(
            "Landlock ABI {NET_ABI} is needed to deny the network and the kernel has ABI {abi}"
        ))
    } else {
        None
    };
    if let Some(missing) = missing {
        if profile.require {
            return Err(ConfinementError::Unsupported { role, missing });
        }
        tracing::warn!("running the {role} unconfined: {missing}");
        return Ok(Confinement {
            profile,
            policy: None,
            ruleset: None,
            unconfined_because: Some(missing),
            abi,
        });
    }
    let ruleset_error = |e: &dyn std::fmt::Display| ConfinementError::Ruleset {
        role: role.clone(),
        reason: e.to_string(),
    };
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(FS_ABI))
        .map_err(|e| ruleset_error(&e))?;
    if !profile.network {
        // Handled with no rule: every TCP bind and connect is denied.
        ruleset = ruleset
            .handle_access(AccessNet::BindTcp | AccessNet::ConnectTcp)
            .map_err(|e| ruleset_error(&e))?;
    }
    let mut created = ruleset.create().map_err(|e| ruleset_error(&e))?;
    let grants = [
        (&profile.read, AccessFs::from_read(FS_ABI)),
        (&profile.write, AccessFs::from_all(FS_ABI)),
    ];
    for (paths, rights) in grants {
        for path in paths {
            let path_error = |reason: String| ConfinementError::Path {
                role: role.clone(),
                path: path.clone(),
                reason,
            };
            let Ok(metadata) = std::fs::metadata(path) else {
                // A granted path that does not exist grants nothing.
                continue;
            };
            // Folder-only rights cannot be granted on a file.
            let rights = if metadata.is_dir() {
                rights
            } else {
                rights & AccessFs::from_file(FS_ABI)
            };
            let fd = PathFd::new(path).map_err(|e| path_error(e.to_string()))?;
            created = created
                .add_rule(PathBeneath::new(fd, rights))
                .map_err(|e| path_error(e.to_string()))?;
        }
    }
    let fd: Option<OwnedFd> = created.into();
    let fd = fd.ok_or_else(|| ruleset_error(&"the kernel made no ruleset"))?;
    Ok(Confinement {
        profile,
        policy: None,
        ruleset: Some(Arc::new(fd)),
        unconfined_because: None,
        abi,
    })
}

/// Applies a prepared ruleset to the calling process. Runs in the child between fork and exec:
/// it makes two system calls and nothing else (no allocation, no lock).
pub fn restrict_child(ruleset: RawFd) -> std::io::Result<()> {
    // SAFETY: plain system calls on integers; both are async-signal-safe.
    unsafe {
        if nix::libc::prctl(nix::libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if nix::libc::syscall(nix::libc::SYS_landlock_restrict_self, ruleset, 0u32) != 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::process::{self, CaptureOptions, CommandSpec};

    #[tokio::test]
    async fn a_confined_child_writes_only_where_its_profile_allows() {
        let abi = kernel_abi();
        if abi < NET_ABI {
            eprintln!("skipping: this kernel has Landlock ABI {abi}, and {NET_ABI} is needed");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let (inside, outside) = (dir.path().join("inside"), dir.path().join("outside"));
        std::fs::create_dir_all(&inside).unwrap();
        std::fs::create_dir_all(&outside).unwrap();
        let confinement = prepare(Profile {
            role: "test".into(),
            read: vec!["/".into()],
            write: vec![inside.clone()],
            network: false,
            require: true,
        })
        .unwrap();
        assert!(
            confinement.record()["enforced"]
                .as_str()
                .unwrap()
                .starts_with("landlock")
        );
        let script = format!(
            "echo ok > {}/a; echo no > {}/b",
            inside.display(),
            outside.display()
        );
        let spec = CommandSpec {
            program: "sh".into(),
            args: vec!["-c".into(), script],
            env: process::base_env(),
            cwd: dir.path().to_owned(),
            stdin: None,
            confinement: Some(confinement),
        };
        let options = CaptureOptions {
            limit: 4096,
            spill_dir: dir.path().to_owned(),
            roster: None,
            live: None,
        };
        let finished = process::run(&spec, &options, &Default::default())
            .await
            .unwrap();
        assert!(inside.join("a").exists());
        assert!(!outside.join("b").exists());
        let stderr = String::from_utf8_lossy(&finished.stderr.head);
        assert!(stderr.contains("Permission denied"), "{stderr}");
    }

    #[test]
    fn without_the_kernel_a_required_profile_refuses_and_an_optional_one_runs_unconfined() {
        let profile = |require, network| Profile {
            role: "builder".into(),
            read: vec!["/".into()],
            write: vec![],
            network,
            require,
        };
        let err = prepare_for(profile(true, false), 0)
            .unwrap_err()
            .to_string();
        assert!(
            err.starts_with("refusing to run the builder unconfined: this kernel has no Landlock"),
            "{err}"
        );
        let err = prepare_for(profile(true, false), 3)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("Landlock ABI 4 is needed to deny the network"),
            "{err}"
        );
        let unconfined = prepare_for(profile(false, false), 0).unwrap();
        assert_eq!(unconfined.ruleset_fd(), None);
        assert_eq!(unconfined.record()["enforced"], "none");
        assert_eq!(
            unconfined.record()["unconfined_because"],
            "this kernel has no Landlock"
        );
        // A profile that allows the network needs no TCP rules, so ABI 3 enforces it.
        if kernel_abi() >= 3 {
            assert!(
                prepare_for(profile(true, true), 3)
                    .unwrap()
                    .ruleset_fd()
                    .is_some()
            );
        }
    }
}
