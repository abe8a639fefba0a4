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

use std::path::{Path, PathBuf};
use std::sync::Mutex;

use nix::sys::inotify::{AddWatchFlags, InitFlags, Inotify, WatchDescriptor};

/// The decoys of one launch: each file, made in a private folder, where it appears in the
/// view, and the inotify instance that watches them.
pub struct Tripwires {
    /// Removed with the launch.
    folder: tempfile::TempDir,
    wires: Vec<(PathBuf, PathBuf)>,
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
            .tempdir()?;
        let inotify = Inotify::init(InitFlags::IN_NONBLOCK | InitFlags::IN_CLOEXEC)?;
        let mut wires = Vec::with_capacity(laid.len());
        let mut watches = Vec::with_capacity(laid.len());
        for (n, path) in laid.into_iter().enumerate() {
            let decoy = folder.path().join(n.to_string());
            std::fs::write(&decoy, b"")?;
            std::fs::set_permissions(&decoy, std::os::unix::fs::PermissionsExt::from_mode(0o444))?;
            watches.push(inotify.add_watch(&decoy, AddWatchFlags::IN_OPEN)?);
            wires.push((decoy, path.clone()));
        }
        Ok(Some(Self {
            folder,
            wires,
            inotify,
            watches,
            sprung: Mutex::new(None),
        }))
    }

    /// Each decoy's file and where it appears in the view.
    pub fn mounts(&self) -> &[(PathBuf, PathBuf)] {
        &self.wires
    }

    /// The first decoy a process has opened, as the view shows it, if any has been.
    pub fn sprung(&self) -> Option<PathBuf> {
        let mut sprung = self.sprung.lock().ok()?;
        if sprung.is_none() {
            // Without an event this fails (EAGAIN) at once.
            *sprung = self.inotify.read_events().ok().and_then(|events| {
                events.iter().find_map(|event| {
                    let n = self.watches.iter().position(|wd| *wd == event.wd)?;
                    Some(self.wires[n].1.clone())
                })
            });
        }
        sprung.clone()
    }
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
        assert_eq!(shown, [PathBuf::from("/root/.ssh/id_rsa")]);
        assert!(
            Tripwires::lay(&wires[1..], &[Path::new("/")])
                .unwrap()
                .is_none()
        );
    }

    #[test]
    fn an_open_springs_the_wire_and_stays_seen() {
        let laid = Tripwires::lay(&[PathBuf::from("/nowhere/id_rsa")], &[])
            .unwrap()
            .unwrap();
        let decoy = laid.mounts()[0].0.clone();
        // Looking is not opening.
        std::fs::metadata(&decoy).unwrap();
        assert_eq!(laid.sprung(), None);
        assert_eq!(std::fs::read(&decoy).unwrap(), b"");
        assert_eq!(laid.sprung().as_deref(), Some(Path::new("/nowhere/id_rsa")));
        // The event was read once; the finding stays.
        assert_eq!(laid.sprung().as_deref(), Some(Path::new("/nowhere/id_rsa")));
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
