//! Tripwires: decoys where secrets usually live (`~/.ssh/id_rsa`, `~/.aws/credentials`,
//! `/etc/shadow`), laid in a confined process's view where the real file is absent from it.
//!
//! The mount view already keeps the real files out: a read finds nothing. A tripwire turns the
//! attempt itself into evidence. Each decoy is an empty file kavi made and watches with inotify
//! for being opened: the kernel queues the event whoever opens it, through whatever path, and
//! whether or not the opener lives on, so kavi sees it while the process runs and once more
//! after it ended. The reader gets an empty file, and the process is stopped.
//!
//! What it does not see: a process that only looks (`stat`, listing the folder, an `O_PATH`
//! handle) and never opens the file; it reads nothing either way.

use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// The decoys of one launch: each file, made in a private folder, where it appears in the
/// view, and the inotify instance that watches them.
pub struct Tripwires {
    /// Removed with the launch. It mirrors the view: the decoy for `/root/.ssh/id_rsa` is
    /// `root/.ssh/id_rsa` in it.
    folder: tempfile::TempDir,
    /// Each decoy's file and where it appears in the view, in the order of `watches`.
    wires: Vec<(PathBuf, PathBuf)>,
    /// What is mounted: a folder of the mirror where it holds every decoy the view shows under
    /// it, a single decoy otherwise.
    binds: Vec<(PathBuf, PathBuf)>,
    inotify: Inotify,
    watches: Vec<WatchDescriptor>,
    /// The first decoy seen opened: the event is read once, the finding kept.
    sprung: Mutex<Option<PathBuf>>,
}

impl Tripwires {
    /// The private folder the decoys are in.
    pub fn folder(&self) -> &Path {
        self.folder.path()
    }

    /// Lays a decoy at each of `paths` that the view would not show otherwise: not inside any
    /// folder the view mounts (`mounted`), where the real file could be shown, nor where
    /// something is mounted on it. `None` when none is laid.
    ///
    /// Decoys that share a folder nothing else is mounted in are mounted as that folder (all of
    /// `~/` is usually one mount): each mount costs the sandbox's start a little.
    pub fn lay(paths: &[PathBuf], mounted: &[&Path]) -> std::io::Result<Option<Self>> {
        let laid: Vec<&PathBuf> = paths
            .iter()
            .filter(|path| path.is_absolute())
            .filter(|path| {
                !mounted
                    .iter()
                    .any(|m| path.starts_with(m) || m.starts_with(path))
            })
            .collect();
        if laid.is_empty() {
            return Ok(None);
        }
        let folder = tempfile::Builder::new()
            .prefix("kavi-tripwires-")
            .tempdir_in(kavi_foundation::sandbox::memory_temp_dir())?;
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        // Closed: in a folder every account shares, another could open a decoy and stop the
        // run as an attack. Only folders below it are mounted, and those look like ones
        // bubblewrap would make to mount on.
        std::fs::set_permissions(folder.path(), PermissionsExt::from_mode(0o700))?;
        let mut wires = Vec::with_capacity(laid.len());
        let mut watches = Vec::with_capacity(laid.len());
        let mut binds: Vec<(PathBuf, PathBuf)> = Vec::new();
        for path in laid {
            let decoy = mirrored(folder.path(), path);
            if let Some(parent) = decoy.parent() {
                std::fs::DirBuilder::new()
                    .recursive(true)
                    .mode(0o755)
                    .create(parent)?;
            }
            std::fs::write(&decoy, b"")?;
            std::fs::set_permissions(&decoy, PermissionsExt::from_mode(0o444))?;
            watches.push(inotify.add_watch(&decoy, AddWatchFlags::IN_OPEN)?);
            wires.push((decoy, path.clone()));
            let shown = mount_root(path, mounted);
            if !binds.iter().any(|(_, bound)| bound == shown) {
                binds.push((mirrored(folder.path(), shown), shown.to_owned()));
            }
        }
        Ok(Some(Self {
            folder,
            wires,
            binds,
            inotify,
            watches,
            sprung: Mutex::new(None),
        }))
    }

    /// What to mount read-only, and where in the view: every decoy is under one of them.
    pub fn mounts(&self) -> &[(PathBuf, PathBuf)] {
        &self.binds
    }

    /// The first decoy a process has opened, as the view shows it, if any has been.
    pub fn sprung(&self) -> Option<PathBuf> {
        let mut sprung = self.sprung.lock().ok()?;
        if sprung.is_none() {
            // Without an event this fails (EAGAIN) at once.
            *sprung = self.inotify.read_events().ok().and_then(|events| {
                events.iter().find_map(|event| {
                    // A watch removed by `disarm` queues an event of its own.
                    if !event.mask.contains(AddWatchFlags::IN_OPEN) {
                        return None;
                    }
                    let n = self.watches.iter().position(|wd| *wd == event.wd)?;
                    Some(self.wires[n].1.clone())
                })
            });
        }
        sprung.clone()
    }

    /// Stops watching, once the last look ([`Self::sprung`]) has been taken. The kernel frees
    /// a watch only after a grace period, and closing the instance while watches are on waits
    /// for it: 10 to 20 ms at the end of most launches. Removed here, they are freed while the
    /// launch's records are written, and the close at the end has nothing left to wait for.
    pub fn disarm(&self) {
        for watch in &self.watches {
            let _ = self.inotify.rm_watch(*watch);
        }
    }
}

/// Where `shown` (an absolute path) is in the mirror `folder`.
fn mirrored(folder: &Path, shown: &Path) -> PathBuf {
    folder.join(shown.strip_prefix("/").unwrap_or(shown))
}

/// The shallowest folder above the decoy `path` (or the decoy itself) that nothing in `mounted`
/// lies in or is: mounting the mirror there shows no decoy in place of a real file. The view's
/// own mounts (`/proc`, `/dev`, `/tmp`, `/run`) count as mounted.
fn mount_root<'p>(path: &'p Path, mounted: &[&Path]) -> &'p Path {
    const VIEW: [&str; 4] = ["/proc", "/dev", "/tmp", "/run"];
    let taken = |folder: &Path| {
        mounted.iter().any(|m| m.starts_with(folder))
            || VIEW.iter().any(|m| Path::new(m).starts_with(folder))
    };
    let mut ancestors: Vec<&Path> = path.ancestors().filter(|a| a.parent().is_some()).collect();
    ancestors.reverse();
    ancestors
        .into_iter()
        .find(|folder| !taken(folder))
        .unwrap_or(path)
}

/// `~/...` entries resolved against `home` (dropped without one), others as written.
pub fn resolve(entries: &[String], home: Option<&Path>) -> Vec<PathBuf> {
    entries
        .iter()
        .filter_map(|entry| match entry.strip_prefix("~/") {
            Some(rest) => home.map(|home| home.join(rest)),
            None => Some(PathBuf::from(entry)),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decoys_go_only_where_the_view_shows_nothing() {
        let wires = [
            PathBuf::from("/root/.ssh/id_rsa"),
            PathBuf::from("/work/space/.aws/credentials"),
            PathBuf::from("/etc/shadow"),
        ];
        let laid = Tripwires::lay(
            &wires,
            &[Path::new("/work/space"), Path::new("/etc/shadow")],
        )
        .unwrap()
        .unwrap();
        let shown: Vec<_> = laid.mounts().iter().map(|(_, p)| p.clone()).collect();
        assert_eq!(shown, [PathBuf::from("/root")]);
        assert!(
            Tripwires::lay(&wires[1..], &[Path::new("/")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn decoys_share_a_mount_where_nothing_else_is_mounted() {
        let wires = [
            PathBuf::from("/root/.ssh/id_rsa"),
            PathBuf::from("/root/.aws/credentials"),
            PathBuf::from("/root/work/.netrc"),
            PathBuf::from("/etc/shadow"),
            PathBuf::from("/etc/ssh/ssh_host_rsa_key"),
            PathBuf::from("/etc/ssh/ssh_host_ed25519_key"),
            PathBuf::from("/tmp/.pgpass"),
        ];
        // The workspace is under ~/, and /etc shows a few files of the host's.
        let mounted = [Path::new("/root/work/space"), Path::new("/etc/passwd")];
        let laid = Tripwires::lay(&wires, &mounted).unwrap().unwrap();
        let shown: Vec<_> = laid.mounts().iter().map(|(_, p)| p.clone()).collect();
        assert_eq!(
            shown,
            [
                "/root/.ssh",
                "/root/.aws",
                "/root/work/.netrc",
                "/etc/shadow",
                "/etc/ssh",
                "/tmp/.pgpass"
            ]
            .map(PathBuf::from)
        );
        // Each mount's source holds exactly the decoys shown under it, and nothing else.
        for (source, shown) in laid.mounts() {
            let under: Vec<_> = wires.iter().filter(|w| w.starts_with(shown)).collect();
            for wire in &under {
                let rest = wire.strip_prefix(shown).unwrap();
                let decoy = if rest.as_os_str().is_empty() {
                    source.clone()
                } else {
                    source.join(rest)
                };
                assert_eq!(std::fs::read(&decoy).unwrap(), b"", "{}", decoy.display());
            }
            if source.is_dir() {
                let files = walkdir::WalkDir::new(source)
                    .into_iter()
                    .filter(|e| e.as_ref().unwrap().file_type().is_file())
                    .count();
                assert_eq!(files, under.len(), "{}", shown.display());
            }
        }
        // Reading the mounted folder's file springs the wire of the path it is shown as.
        let (source, _) = &laid.mounts()[0];
        std::fs::read(source.join("id_rsa")).unwrap();
        assert_eq!(
            laid.sprung().as_deref(),
            Some(Path::new("/root/.ssh/id_rsa"))
        );
    }

    #[test]
    fn an_open_springs_the_wire_and_stays_seen() {
        let laid = Tripwires::lay(&[PathBuf::from("/nowhere/id_rsa")], &[])
            .unwrap()
            .unwrap();
        let decoy = laid.folder().join("nowhere/id_rsa");
        // Closed to other accounts, which could otherwise spring it.
        let mode = std::fs::metadata(laid.folder())
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o700);
        // Looking is not opening.
        std::fs::metadata(&decoy).unwrap();
        assert_eq!(laid.sprung(), None);
        assert_eq!(std::fs::read(&decoy).unwrap(), b"");
        assert_eq!(laid.sprung().as_deref(), Some(Path::new("/nowhere/id_rsa")));
        // The event was read once; the finding stays.
        assert_eq!(laid.sprung().as_deref(), Some(Path::new("/nowhere/id_rsa")));
    }

    #[test]
    fn disarming_is_not_an_open_and_keeps_one_made_before() {
        let wires = [
            PathBuf::from("/nowhere/id_rsa"),
            PathBuf::from("/nowhere/id_ed25519"),
        ];
        // Removing the watches queues an event for each: none of them is an open.
        let quiet = Tripwires::lay(&wires, &[]).unwrap().unwrap();
        quiet.disarm();
        assert_eq!(quiet.sprung(), None);
        // An open before the watches went is still read after.
        let opened = Tripwires::lay(&wires, &[]).unwrap().unwrap();
        std::fs::read(opened.folder().join("nowhere/id_ed25519")).unwrap();
        opened.disarm();
        assert_eq!(
            opened.sprung().as_deref(),
            Some(Path::new("/nowhere/id_ed25519"))
        );
    }

    #[test]
    fn home_entries_follow_home_and_vanish_without_one() {
        let entries = ["~/.ssh/id_rsa".to_owned(), "/etc/shadow".to_owned()];
        assert_eq!(
            resolve(&entries, Some(Path::new("/home/a"))),
            [
                PathBuf::from("/home/a/.ssh/id_rsa"),
                PathBuf::from("/etc/shadow")
            ]
        );
        assert_eq!(resolve(&entries, None), [PathBuf::from("/etc/shadow")]);
    }
}
