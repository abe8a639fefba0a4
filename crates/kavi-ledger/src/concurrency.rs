//! Concurrency groups: at most `limit` runs of a group at once, across the processes that share
//! a ledger (Argo's `synchronization` semaphores, GitHub Actions' `concurrency`).
//!
//! On a ledger file, whose kavis share a machine, a run holds one of the group's slots, a file in
//! the locks folder it keeps locked for its life, with its process id written in it for whoever
//! finds the group full. The lock goes with the process, however it ends: a killed run never
//! leaves its group full.
//!
//! On a server's ledger, whose kavis run on many machines, a slot is a row of `group_slots`
//! held for a lease its holder renews, as a step's claim on a node (see [`super::claims`]): a
//! holder that died, or whose machine did, frees its slot when its lease runs out. A kavi that
//! wants its holders gone (`cancel-running`) marks their rows; each holder finds the mark when it
//! renews, and cancels its run.

use std::fs::File;
use std::io::{self, Read as _, Write as _};
use std::path::Path;

use super::claims::{lease, lease_end};
use super::db::{OptionalExtension, params};
use super::{Ledger, Result, format_time};

/// A slot of a group, held until dropped.
#[derive(Debug)]
pub struct GroupSlot {
    _file: File,
}

/// Takes a free slot of `group` (one of `limit`) for this process from the lock files in
/// `locks` (a ledger file's locks folder: see [`Ledger::group_locks`]), or says, when every
/// slot is held, the process ids of their holders.
pub fn try_take(locks: &Path, group: &str, limit: u32) -> io::Result<Result<GroupSlot, Vec<u32>>> {
    let folder = locks.join("groups");
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

/// This process, as a server's ledger names a slot's holder: on which machine, which process.
pub fn holder_name() -> String {
    format!("{}@{}", std::process::id(), super::this_host())
}

/// A slot of a group on a server's ledger, as [`Ledger::take_group_slot`] took it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeasedSlot {
    pub group: String,
    pub slot: u32,
    pub holder: String,
}

/// What renewing a leased slot found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// Still its holder's, for another lease.
    Held,
    /// Another kavi asked its holder to make way (`cancel-running`); still held until released.
    MakeWay,
    /// No longer its holder's: its lease ran out and another took it.
    Lost,
}

impl Ledger {
    /// Where this ledger's group slots are lock files: its locks folder, when it is a file. A
    /// server's ledger holds them itself (see [`Ledger::take_group_slot`]).
    pub fn group_locks(&self) -> Option<&Path> {
        (self.conn.backend() == super::db::Backend::Sqlite).then_some(self.locks_dir.as_path())
    }

    /// Takes a free slot of `group` (one of `limit`) for `holder` on this (server's) ledger: an
    /// empty one, or one whose lease ran out, in one statement that one taker wins. Or says,
    /// when every slot is held, who holds them.
    pub fn take_group_slot(
        &self,
        group: &str,
        limit: u32,
        holder: &str,
    ) -> Result<std::result::Result<LeasedSlot, Vec<String>>> {
        let now = format_time(jiff::Timestamp::now());
        let until = lease_end(lease());
        for slot in 0..limit.max(1) {
            let taken = self
                .conn
                .prepare_cached(
                    "INSERT INTO group_slots (grp, slot, holder, lease_until) VALUES (?1, ?2, ?3, ?4)
                     ON CONFLICT (grp, slot)
                     DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until,
                                   make_way = 0
                     WHERE group_slots.lease_until <= ?5",
                )?
                .execute(params![group, slot, holder, until, now])?;
            if taken > 0 {
                return Ok(Ok(LeasedSlot {
                    group: group.to_owned(),
                    slot,
                    holder: holder.to_owned(),
                }));
            }
        }
        let holders = self
            .conn
            .prepare_cached(
                "SELECT holder FROM group_slots WHERE grp = ?1 AND slot < ?2 AND lease_until > ?3
                 ORDER BY slot",
            )?
            .query_map(params![group, limit, now], |row| row.get(0))?
            .collect::<super::db::Result<Vec<String>>>()?;
        Ok(Err(holders))
    }

    /// Renews `slot`'s lease for its holder.
    pub fn renew_group_slot(&self, slot: &LeasedSlot) -> Result<Renewal> {
        let make_way: Option<i64> = self
            .conn
            .prepare_cached(
                "UPDATE group_slots SET lease_until = ?1
                 WHERE grp = ?2 AND slot = ?3 AND holder = ?4
                 RETURNING make_way",
            )?
            .query_row(
                params![lease_end(lease()), slot.group, slot.slot, slot.holder],
                |row| row.get(0),
            )
            .optional()?;
        Ok(match make_way {
            None => Renewal::Lost,
            Some(0) => Renewal::Held,
            Some(_) => Renewal::MakeWay,
        })
    }

    /// Frees `slot`, unless another took it meanwhile.
    pub fn release_group_slot(&self, slot: &LeasedSlot) -> Result<()> {
        self.conn
            .prepare_cached("DELETE FROM group_slots WHERE grp = ?1 AND slot = ?2 AND holder = ?3")?
            .execute(params![slot.group, slot.slot, slot.holder])?;
        Ok(())
    }

    /// Asks `holder` to make way in `group`: it cancels its run when it next renews a slot.
    pub fn ask_to_make_way(&self, group: &str, holder: &str) -> Result<()> {
        self.conn
            .prepare_cached("UPDATE group_slots SET make_way = 1 WHERE grp = ?1 AND holder = ?2")?
            .execute(params![group, holder])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_group_holds_as_many_runs_as_its_limit_and_frees_a_slot_when_one_ends() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path();
        let first = try_take(ledger, "deploy", 2).unwrap().unwrap();
        let _second = try_take(ledger, "deploy", 2).unwrap().unwrap();
        let pid = std::process::id();
        assert_eq!(
            try_take(ledger, "deploy", 2).unwrap().unwrap_err(),
            [pid, pid]
        );
        // Another group is another semaphore.
        assert!(try_take(ledger, "other", 1).unwrap().is_ok());
        drop(first);
        assert!(try_take(ledger, "deploy", 2).unwrap().is_ok());
    }

    /// The leased slots' statements, written once for SQLite and PostgreSQL, on SQLite (the
    /// server's side is tests/integration/team.rs's).
    #[test]
    fn a_leased_slot_is_taken_once_renewed_asked_to_make_way_and_freed_when_its_lease_ran_out() {
        let (_dir, ledger, _owner) = crate::testing::fresh_ledger();
        let first = ledger.take_group_slot("deploy", 1, "1@a").unwrap().unwrap();
        assert_eq!((first.slot, first.holder.as_str()), (0, "1@a"));
        assert_eq!(
            ledger
                .take_group_slot("deploy", 1, "2@b")
                .unwrap()
                .unwrap_err(),
            ["1@a"]
        );
        // Another group is another semaphore; a larger limit, another slot.
        assert!(ledger.take_group_slot("other", 1, "2@b").unwrap().is_ok());
        let second = ledger.take_group_slot("deploy", 2, "2@b").unwrap().unwrap();
        assert_eq!(second.slot, 1);
        assert_eq!(ledger.renew_group_slot(&first).unwrap(), Renewal::Held);
        ledger.ask_to_make_way("deploy", "1@a").unwrap();
        assert_eq!(ledger.renew_group_slot(&first).unwrap(), Renewal::MakeWay);
        // Its holder died: once its lease has run out, the slot is another's, and the dead
        // holder's renewal finds it lost.
        ledger
            .conn
            .execute(
                "UPDATE group_slots SET lease_until = ?1 WHERE holder = '1@a'",
                params![format_time(jiff::Timestamp::now() - Duration::from_secs(1))],
            )
            .unwrap();
        let taken = ledger.take_group_slot("deploy", 1, "3@c").unwrap().unwrap();
        assert_eq!(taken.slot, 0);
        assert_eq!(ledger.renew_group_slot(&taken).unwrap(), Renewal::Held);
        assert_eq!(ledger.renew_group_slot(&first).unwrap(), Renewal::Lost);
        // Releasing what another holds frees nothing; its holder's release does.
        ledger.release_group_slot(&first).unwrap();
        assert!(ledger.take_group_slot("deploy", 1, "2@b").unwrap().is_err());
        ledger.release_group_slot(&taken).unwrap();
        assert!(ledger.take_group_slot("deploy", 1, "2@b").unwrap().is_ok());
    }
}
