//! Opening the ledger on a second thread while the caller does work it must do anyway.
//!
//! A new ledger's schema and the syncs of switching it to WAL take milliseconds before a run's
//! first node can start; none of it needs the pipeline, which can load meanwhile.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;

use super::{Ledger, LedgerError, Result};

/// Runs `meanwhile` on this thread while the ledger at `path` is opened (as [`Ledger::open`]:
/// created, migrated, recovered) on another, and returns both. The ledger is opened whatever
/// `meanwhile` returns; if no thread can be started, it is opened here, afterwards. It comes
/// with the spare connection the run's recorder will write on ([`Ledger::open_spare`]), made
/// by whichever thread is free first: this one, once `meanwhile` is done, while the other
/// still sets up its own connection (a small pipeline), or the other, once it is done (a
/// large one). Should that fail, the recorder tries again and says why. The other thread also
/// looks up who is acting ([`kavi_foundation::identity::actor`]), which the run records.
pub fn open_during<T>(path: &Path, meanwhile: impl FnOnce() -> T) -> (T, Result<Ledger>) {
    let spare_taken = AtomicBool::new(false);
    let (made, file_there) = mpsc::sync_channel(1);
    std::thread::scope(|scope| {
        let opening = std::thread::Builder::new()
            .name("kavi-ledger-open".into())
            .spawn_scoped(scope, || {
                let mut ledger = Ledger::open_telling(path, move || {
                    let _ = made.send(());
                })?;
                if !spare_taken.swap(true, Ordering::AcqRel) {
                    let _ = ledger.open_spare();
                }
                // The run records who started it before its first node starts: the account's
                // lookup is made here rather than then.
                kavi_foundation::identity::actor();
                Ok(ledger)
            });
        let value = meanwhile();
        // Reading the schema takes a connection about as long as the ledger takes to set up
        // its own: here it does not wait for that. Only once the file is there to connect to.
        let spare = match file_there.recv() {
            Ok(()) if !spare_taken.swap(true, Ordering::AcqRel) => Ledger::connect_spare(path).ok(),
            _ => None,
        };
        let ledger = match opening {
            Ok(thread) => thread.join().unwrap_or_else(|_| {
                Err(LedgerError::Io(std::io::Error::other(
                    "the thread opening the ledger stopped unexpectedly",
                )))
            }),
            Err(_) => Ledger::open(path),
        };
        let ledger = ledger.map(|mut ledger| {
            if let Some(spare) = spare {
                ledger.spare = Some(Box::new(spare));
            }
            ledger
        });
        (value, ledger)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_ledger_opens_while_the_caller_works_and_either_failure_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".kavi/ledger.db");
        // The spare is made by whichever thread is free first: this one at once, or the
        // opening one while this one is still busy. Either way it comes with the ledger.
        let slow = dir.path().join("slow/ledger.db");
        let (_, ledger) = open_during(&slow, || std::thread::sleep(Duration::from_millis(300)));
        let mut ledger = ledger.unwrap();
        assert!(matches!(
            ledger.another_connection().unwrap().0,
            super::super::connection::Way::Made(_)
        ));
        let (value, ledger) = open_during(&path, || 7);
        assert_eq!(value, 7);
        // It comes with its spare connection, which is handed out once.
        let mut ledger = ledger.unwrap();
        let spare = ledger.another_connection().unwrap();
        assert!(matches!(spare.0, super::super::connection::Way::Made(_)));
        assert!(matches!(
            ledger.another_connection().unwrap().0,
            super::super::connection::Way::To { .. }
        ));
        // The spare writes to the same file.
        let mut spare = spare.open().unwrap();
        let owner = super::super::Owner::claim(&path, dir.path()).unwrap();
        let run_id = spare
            .create_run(&crate::testing::new_run(
                &serde_json::Value::Null,
                &["a"],
                &owner,
            ))
            .unwrap();
        assert!(ledger.run(run_id).is_ok());
        // A ledger that cannot be made: its parent is a file.
        std::fs::write(dir.path().join("file"), "").unwrap();
        let (value, ledger) = open_during(&dir.path().join("file/ledger.db"), || "loaded");
        assert_eq!(value, "loaded");
        assert!(ledger.is_err());
    }
}
