//! Concurrency groups: at most `limit` runs of a group at once, across the processes that share
//! a ledger (Argo's `synchronization` semaphores, GitHub Actions' `concurrency`). A run holds
//! one of the group's slots, a file in the locks folder it keeps locked for its life, with its
//! process id written in it for whoever finds the group full. The lock goes with the process,
//! however it ends: a killed run never leaves its group full.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::path::Path;

/// A slot of a group, held until dropped.
#[derive(Debug)]
pub struct GroupSlot {
    _file: File,
}

/// Takes a free slot of `group` (one of `limit`) for this process, or says, when every slot is
/// held, the process ids of their holders.
pub fn try_take(ledger: &Path, group: &str, limit: u32) -> io::Result<Result<GroupSlot, Vec<u32>>> {
    let folder = super::locks_dir(ledger).join("groups");
    std::fs::create_dir_all(&folder)?;
    let mut holders = Vec::new();
    for slot in 0..limit.max(1) {
        let mut file = File::options()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .open(folder.join(format!("{group}.{slot}")))?;
        match file.try_lock() {
            Ok(()) => {
                file.set_len(0)?;
                write!(file, "{}", std::process::id())?;
                return Ok(Ok(GroupSlot { _file: file }));
            }
            Err(std::fs::TryLockError::WouldBlock) => {
                let mut text = String::new();
                file.read_to_string(&mut text)?;
                // Empty while its holder is writing it.
                holders.extend(text.trim().parse::<u32>().ok());
            }
            Err(std::fs::TryLockError::Error(e)) => return Err(e),
        }
    }
    Ok(Err(holders))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_holds_as_many_runs_as_its_limit_and_frees_a_slot_when_one_ends() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.db");
        let first = try_take(&ledger, "deploy", 2).unwrap().unwrap();
        let _second = try_take(&ledger, "deploy", 2).unwrap().unwrap();
        let pid = std::process::id();
        assert_eq!(
            try_take(&ledger, "deploy", 2).unwrap().unwrap_err(),
            [pid, pid]
        );
        // Another group is another semaphore.
        assert!(try_take(&ledger, "other", 1).unwrap().is_ok());
        drop(first);
        assert!(try_take(&ledger, "deploy", 2).unwrap().is_ok());
    }
}
