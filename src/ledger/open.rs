//! Opening the ledger on a second thread while the caller does work it must do anyway.
//!
//! A new ledger's schema and the syncs of switching it to WAL take milliseconds before a run's
//! first node can start; none of it needs the pipeline, which can load meanwhile.

use std::path::Path;

use super::{Ledger, LedgerError, Result};

/// Runs `meanwhile` on this thread while the ledger at `path` is opened (as [`Ledger::open`]:
/// created, migrated, recovered) on another, and returns both. The ledger is opened whatever
/// `meanwhile` returns; if no thread can be started, it is opened here, afterwards. The other
/// thread also makes the spare connection the run's recorder will write on
/// ([`Ledger::open_spare`]); should that fail, the recorder tries again and says why. It also
/// looks up who is acting ([`crate::identity::actor`]), which the run records.
pub fn open_during<T>(path: &Path, meanwhile: impl FnOnce() -> T) -> (T, Result<Ledger>) {
    std::thread::scope(|scope| {
        let opening = std::thread::Builder::new()
            .name("kavi-ledger-open".into())
            .spawn_scoped(scope, || {
                let mut ledger = Ledger::open(path)?;
                let _ = ledger.open_spare();
                // The run records who started it before its first node starts: the account's
                // lookup is made here rather than then.
                crate::identity::actor();
                Ok(ledger)
            });
        let value = meanwhile();
        let ledger = match opening {
            Ok(thread) => thread.join().unwrap_or_else(|_| {
                Err(LedgerError::Io(std::io::Error::other(
                    "the thread opening the ledger stopped unexpectedly",
                )))
            }),
            Err(_) => Ledger::open(path),
        };
        (value, ledger)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ledger_opens_while_the_caller_works_and_either_failure_is_kept() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(".kavi/ledger.db");
        let (value, ledger) = open_during(&path, || 7);
        assert_eq!(value, 7);
        // It comes with its spare connection, which is handed out once.
        let mut ledger = ledger.unwrap();
        let spare = ledger.another_connection().unwrap();
        assert!(matches!(spare.0, super::super::Way::Made(_)));
        assert!(matches!(
            ledger.another_connection().unwrap().0,
            super::super::Way::To { .. }
        ));
        // The spare writes to the same file.
        let mut spare = spare.open().unwrap();
        let owner = super::super::Owner::claim(&path, dir.path()).unwrap();
        let run_id = spare
            .create_run(&super::super::tests::new_run(
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
