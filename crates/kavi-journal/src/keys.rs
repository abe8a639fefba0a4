//! kavi's keys: where they live (outside every workspace), and the journal's MAC key.
//!
//! The folder is `$KAVI_KEYS`, else `$XDG_CONFIG_HOME/kavi`, else `~/.config/kavi`: set by the
//! operator's environment, never by a workspace's own files, so that whoever can edit a
//! workspace cannot point kavi at a key of their own. It holds:
//!
//! - `signing.key`: the ed25519 key that signs checkpoints (`kavi ledger keygen`);
//! - `journal.key`: the HMAC-SHA256 key every journal entry is MACed with, made on first use;
//! - `ledgers/<id>.log`: each ledger's checkpoints and key rotations, by the ledger's identity
//!   (see [`crate::checkpoint`]), and `ledgers/paths`: which identity was last seen where.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use hmac::{KeyInit, Mac};

type HmacSha256 = hmac::Hmac<sha2_mac::Sha256>;

/// Set by the test fixtures (`kavi_ledger::testing`): unit tests, this crate's and the crates'
/// above it (for which this crate is built without `cfg(test)`), keep their keys apart from the
/// account's own.
static UNIT_TEST_KEYS: AtomicBool = AtomicBool::new(false);

/// Makes [`dir`] a temporary folder of this user's for the rest of the process: for unit tests.
#[doc(hidden)]
pub fn use_unit_test_keys() {
    UNIT_TEST_KEYS.store(true, Ordering::Relaxed);
}

/// The folder of kavi's keys, from the environment alone.
pub fn dir() -> PathBuf {
    if cfg!(test) || UNIT_TEST_KEYS.load(Ordering::Relaxed) {
        return std::env::temp_dir().join(format!("kavi-unit-keys-{}", nix::unistd::getuid()));
    }
    if let Some(keys) = std::env::var_os("KAVI_KEYS").filter(|keys| !keys.is_empty()) {
        return PathBuf::from(keys);
    }
    own_dir()
}

/// The account's own configuration folder for kavi: `$XDG_CONFIG_HOME/kavi`, else
/// `~/.config/kavi`.
fn own_dir() -> PathBuf {
    std::env::var_os("XDG_CONFIG_HOME")
        .map(PathBuf::from)
        .filter(|path| path.is_absolute())
        .or_else(|| std::env::var_os("HOME").map(|home| PathBuf::from(home).join(".config")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"))
        .join("kavi")
}

/// Why the keys' folder may not be used with the workspace at `root`, if it may not: inside
/// it, anyone who can edit the workspace could read or replace them.
pub fn refuse_inside(root: &Path) -> Option<String> {
    let keys = dir();
    lies_inside(&keys, root).then(|| {
        format!(
            "kavi's keys folder {} lies in the workspace {}, where whoever can edit the workspace \
             could read or replace the keys; set KAVI_KEYS to a folder outside it",
            keys.display(),
            root.display()
        )
    })
}

/// Whether `keys` is `root` or below it once links and `..` are resolved, for a folder that
/// may not exist yet: its deepest existing ancestor is resolved and the rest appended.
fn lies_inside(keys: &Path, root: &Path) -> bool {
    let root = root.canonicalize().unwrap_or_else(|_| root.to_owned());
    let keys = if keys.is_absolute() {
        keys.to_owned()
    } else {
        std::env::current_dir().unwrap_or_default().join(keys)
    };
    let mut existing = keys.as_path();
    let mut rest = Vec::new();
    let resolved = loop {
        match existing.canonicalize() {
            Ok(resolved) => break resolved,
            Err(_) => match (existing.parent(), existing.file_name()) {
                (Some(parent), Some(name)) => {
                    rest.push(name.to_owned());
                    existing = parent;
                }
                // `..` or the root itself: nothing left to resolve.
                _ => break existing.to_owned(),
            },
        }
    };
    rest.iter()
        .rev()
        .fold(resolved, |path, name| path.join(name))
        .starts_with(&root)
}

/// The file of this account's own ed25519 key, which signs the approvals it gives:
/// `$KAVI_PERSON_KEY`, else `person.key` in the account's own folder ([`own_dir`]), never in
/// `$KAVI_KEYS`, which the accounts that share a ledger share.
pub fn person_key() -> PathBuf {
    if cfg!(test) || UNIT_TEST_KEYS.load(Ordering::Relaxed) {
        return dir().join("person.key");
    }
    std::env::var_os("KAVI_PERSON_KEY")
        .filter(|key| !key.is_empty())
        .map_or_else(|| own_dir().join("person.key"), PathBuf::from)
}

/// The signing key's path.
pub fn signing_key() -> PathBuf {
    dir().join("signing.key")
}

/// Where a ledger's checkpoints and rotations are logged, by its identity.
pub fn log_path(ledger_id: &str) -> PathBuf {
    dir().join("ledgers").join(format!("{ledger_id}.log"))
}

/// The index of which ledger identity was last checkpointed at which location.
pub fn paths_index() -> PathBuf {
    dir().join("ledgers").join("paths")
}

/// Writes `bytes` to a new file at `path` readable by this user only, atomically and never over
/// an existing one: written beside and linked in, so that of two processes making it at once
/// one's file is both's. Returns whether this call made it.
pub fn write_new_private(path: &Path, bytes: &[u8]) -> std::io::Result<bool> {
    let parent = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(parent)?;
    let mut temporary = tempfile::Builder::new()
        .prefix(".kavi-key")
        .permissions(std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .tempfile_in(parent)?;
    temporary.write_all(bytes)?;
    temporary.as_file().sync_all()?;
    match std::fs::hard_link(temporary.path(), path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(e),
    }
}

/// 32 random bytes.
pub fn random_seed() -> std::io::Result<[u8; 32]> {
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut random| std::io::Read::read_exact(&mut random, &mut seed))?;
    Ok(seed)
}

/// The key the journal's entries are MACed with.
pub struct MacKey {
    keyed: HmacSha256,
}

impl MacKey {
    pub(crate) fn new(key: &[u8; 32]) -> Self {
        Self {
            keyed: HmacSha256::new_from_slice(key).expect("HMAC takes a key of any length"),
        }
    }

    /// The MAC of an entry: HMAC-SHA256 over its hash (which covers the entry and, through
    /// `prev`, every entry before it), hex.
    pub fn mac(&self, hash: &str) -> String {
        let mut mac = self.keyed.clone();
        mac.update(hash.as_bytes());
        crate::checkpoint::to_hex(&mac.finalize().into_bytes())
    }
}

/// The journal's MAC key, read from the keys' folder, or made there on first use.
pub fn mac_key() -> Result<&'static MacKey, String> {
    static KEY: OnceLock<Result<MacKey, String>> = OnceLock::new();
    KEY.get_or_init(|| {
        let path = dir().join("journal.key");
        if !path.exists() {
            let seed = random_seed().map_err(|e| format!("cannot make a key: {e}"))?;
            let text = format!("{}\n", crate::checkpoint::to_hex(&seed));
            write_new_private(&path, text.as_bytes()).map_err(|e| {
                format!(
                    "cannot make the journal's MAC key {}: {e} (set KAVI_KEYS to a folder this \
                     account can write, outside the workspace)",
                    path.display()
                )
            })?;
        }
        let text = std::fs::read_to_string(&path).map_err(|e| {
            format!(
                "cannot read the journal's MAC key {}: {e} (every account that writes this \
                 ledger needs it: set KAVI_KEYS to a folder it can read)",
                path.display()
            )
        })?;
        let key = crate::checkpoint::from_hex::<32>(&text)
            .ok_or_else(|| format!("{} is not a MAC key (64 hex digits)", path.display()))?;
        Ok(MacKey::new(&key))
    })
    .as_ref()
    .map_err(Clone::clone)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The MAC is HMAC-SHA256 as others compute it (Python's `hmac`), so that a ledger's
    /// entries can be checked without kavi.
    #[test]
    fn the_mac_is_standard_hmac_sha256() {
        let key = MacKey::new(&[7u8; 32]);
        assert_eq!(
            key.mac("abc"),
            "127da4ced6a839b8f6118bc244684d2663e70cb5ff0adeefca89d7e74d5a0525"
        );
    }

    /// A keys folder beside the workspace, spelled through it with `..` and not made yet, is
    /// outside it; one below it, made or not, through a link or not, is inside.
    #[test]
    fn a_keys_folder_is_inside_the_workspace_only_when_it_resolves_there() {
        let top = tempfile::tempdir().unwrap();
        let workspace = top.path().join("a");
        std::fs::create_dir_all(workspace.join("made")).unwrap();
        std::os::unix::fs::symlink(top.path(), workspace.join("up")).unwrap();
        for (keys, inside) in [
            ("../keys-a", false),
            ("up/keys-a", false),
            ("keys", true),
            ("made", true),
            ("made/../keys", true),
            (".", true),
        ] {
            assert_eq!(
                lies_inside(&workspace.join(keys), &workspace),
                inside,
                "{keys}"
            );
        }
    }
}
