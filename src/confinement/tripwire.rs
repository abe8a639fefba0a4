//! Tripwires: decoys where secrets usually live (`~/.ssh/id_rsa`, `~/.aws/credentials`,
//! `/etc/shadow`), laid in a confined process's view where the real file is absent from it.
//!
//! The mount view already keeps the real files out: a read finds nothing. A tripwire turns the
//! attempt itself into evidence. Each decoy is a FIFO kavi made; a process that opens it for
//! reading waits in `open` until a writer comes, and kavi's watch, which tries to open the
//! writing end without waiting, succeeds only when a reader is there. So the read of a secret
//! is seen, the reader gets nothing (kavi closes its end at once), and the process is stopped
//! as a security violation.
//!
//! What it does not see: a process that checks the file type first, or opens without
//! blocking and gives up at once; those still read nothing.

use std::path::{Path, PathBuf};

/// The decoys of one launch: each FIFO, made in a private folder, and where it appears in the
/// view.
pub struct Tripwires {
    /// Removed with the launch.
    _folder: tempfile::TempDir,
    wires: Vec<(PathBuf, PathBuf)>,
}

impl Tripwires {
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
        let mut wires = Vec::with_capacity(laid.len());
        for (n, path) in laid.into_iter().enumerate() {
            let fifo = folder.path().join(n.to_string());
            nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o644))?;
            wires.push((fifo, path.clone()));
        }
        Ok(Some(Self {
            _folder: folder,
            wires,
        }))
    }

    /// Each decoy's FIFO and where it appears in the view.
    pub fn mounts(&self) -> &[(PathBuf, PathBuf)] {
        &self.wires
    }

    /// The first decoy a process has opened, as the view shows it. A reader waiting in `open`
    /// is let go with nothing to read.
    pub fn sprung(&self) -> Option<&Path> {
        use nix::fcntl::{OFlag, open};
        self.wires.iter().find_map(|(fifo, shown)| {
            // Without a reader this fails (ENXIO) at once; with one, it succeeds and the
            // descriptor is closed straight away: the reader sees an empty file.
            open(
                fifo,
                OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .ok()
            .map(|_| shown.as_path())
        })
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
    fn a_reader_springs_the_wire_and_reads_nothing() {
        let laid = Tripwires::lay(&[PathBuf::from("/nowhere/id_rsa")], &[])
            .unwrap()
            .unwrap();
        assert_eq!(laid.sprung(), None);
        let fifo = laid.mounts()[0].0.clone();
        let reader = std::thread::spawn(move || std::fs::read(fifo).unwrap());
        let sprung = loop {
            if let Some(path) = laid.sprung() {
                break path.to_owned();
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        };
        assert_eq!(sprung, Path::new("/nowhere/id_rsa"));
        assert_eq!(reader.join().unwrap(), b"");
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
