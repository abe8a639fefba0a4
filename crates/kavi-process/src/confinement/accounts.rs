//! The accounts a confined process sees: `/etc/passwd` and `/etc/group` written by kavi, with
//! root, nobody and the account kavi runs as, mounted over the host's. A program that looks a
//! uid up (Python's `pwd`, git, ssh) finds its entry, and nothing in the view reads the host's
//! list of accounts: not by name, and not through a link in the workspace that points there.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// What writes a file's text for the running account.
type Writer = fn(&Ids) -> String;

/// The files replaced, and what writes each.
const FILES: [(&str, Writer); 2] = [("/etc/passwd", passwd), ("/etc/group", group)];

/// The running account, as the written files name it.
struct Ids {
    uid: u32,
    gid: u32,
    user: String,
    group: String,
}

/// The files of one launch, in a private folder removed with it.
pub struct Accounts {
    folder: tempfile::TempDir,
    mounts: Vec<(PathBuf, PathBuf)>,
}

impl Accounts {
    /// Writes the files the view would otherwise show from the host: each one a `read` path
    /// holds (itself or a folder above it). `None` when the view shows neither.
    pub fn write(read: &[PathBuf]) -> std::io::Result<Option<Self>> {
        let shown: Vec<_> = FILES
            .iter()
            .filter(|(file, _)| read.iter().any(|r| Path::new(file).starts_with(r)))
            .collect();
        if shown.is_empty() {
            return Ok(None);
        }
        let folder = tempfile::Builder::new()
            .prefix("kavi-accounts-")
            .tempdir()?;
        std::fs::set_permissions(folder.path(), PermissionsExt::from_mode(0o755))?;
        let ids = Ids::running();
        let mut mounts = Vec::with_capacity(shown.len());
        for (file, text) in shown {
            let written = folder
                .path()
                .join(Path::new(file).file_name().unwrap_or_default());
            std::fs::write(&written, text(&ids))?;
            std::fs::set_permissions(&written, PermissionsExt::from_mode(0o444))?;
            mounts.push((written, PathBuf::from(file)));
        }
        Ok(Some(Self { folder, mounts }))
    }

    /// The private folder the files are in.
    pub fn folder(&self) -> &Path {
        self.folder.path()
    }

    /// Each written file, and where the view shows it.
    pub fn mounts(&self) -> &[(PathBuf, PathBuf)] {
        &self.mounts
    }
}

impl Ids {
    /// kavi's own uid and gid: a user namespace maps the process to them. A name that could
    /// break a line of the files (none an account has) is replaced.
    fn running() -> Self {
        let uid = nix::unistd::getuid();
        let gid = nix::unistd::getgid();
        let clean = |name: Option<String>| {
            name.filter(|n| !n.is_empty() && !n.contains([':', '\n']))
                .unwrap_or_else(|| "kavi".to_owned())
        };
        Self {
            uid: uid.as_raw(),
            gid: gid.as_raw(),
            user: clean(
                nix::unistd::User::from_uid(uid)
                    .ok()
                    .flatten()
                    .map(|u| u.name),
            ),
            group: clean(
                nix::unistd::Group::from_gid(gid)
                    .ok()
                    .flatten()
                    .map(|g| g.name),
            ),
        }
    }
}

/// The uid and gid of `nobody`, as Debian and most others have them.
const NOBODY: u32 = 65534;

fn passwd(ids: &Ids) -> String {
    let mut text = format!(
        "root:x:0:0:root:/root:/usr/sbin/nologin\n\
         nobody:x:{NOBODY}:{NOBODY}:nobody:/nonexistent:/usr/sbin/nologin\n"
    );
    if ids.uid != 0 && ids.uid != NOBODY {
        text.push_str(&format!(
            "{user}:x:{uid}:{gid}:{user}:/nonexistent:/usr/sbin/nologin\n",
            user = ids.user,
            uid = ids.uid,
            gid = ids.gid
        ));
    }
    text
}

fn group(ids: &Ids) -> String {
    let mut text = format!("root:x:0:\nnogroup:x:{NOBODY}:\n");
    if ids.gid != 0 && ids.gid != NOBODY {
        text.push_str(&format!("{}:x:{}:\n", ids.group, ids.gid));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_files_hold_root_nobody_and_the_running_account_only() {
        let ids = Ids {
            uid: 1000,
            gid: 1001,
            user: "ana".into(),
            group: "staff".into(),
        };
        assert_eq!(
            passwd(&ids),
            "root:x:0:0:root:/root:/usr/sbin/nologin\n\
             nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n\
             ana:x:1000:1001:ana:/nonexistent:/usr/sbin/nologin\n"
        );
        assert_eq!(group(&ids), "root:x:0:\nnogroup:x:65534:\nstaff:x:1001:\n");
        let root = Ids {
            uid: 0,
            gid: 0,
            user: "root".into(),
            group: "root".into(),
        };
        assert_eq!(passwd(&root).lines().count(), 2);
        assert_eq!(group(&root).lines().count(), 2);
    }

    #[test]
    fn only_the_files_a_view_shows_are_written() {
        let none = Accounts::write(&[PathBuf::from("/usr")]).unwrap();
        assert!(none.is_none());
        let one = Accounts::write(&[PathBuf::from("/etc/group")])
            .unwrap()
            .unwrap();
        let shown: Vec<_> = one.mounts().iter().map(|(_, to)| to.clone()).collect();
        assert_eq!(shown, [PathBuf::from("/etc/group")]);
        let both = Accounts::write(&[PathBuf::from("/etc")]).unwrap().unwrap();
        assert_eq!(both.mounts().len(), 2);
        for (written, _) in both.mounts() {
            assert!(written.starts_with(both.folder()));
        }
    }
}
