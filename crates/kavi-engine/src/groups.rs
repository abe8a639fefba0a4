//! What a run or a node attempt does when it asks its concurrency group for a slot (see
//! [`crate::ledger::concurrency`]): takes one, or, with the group full, does what its
//! `on_conflict` says. Pipelines (`[pipeline] concurrency`) and nodes (`concurrency`) both go
//! through [`GroupWait`], so a group is one semaphore whoever names it.

use std::collections::HashSet;
use std::path::Path;

use crate::ledger::concurrency::{GroupSlot, try_take};
use crate::spec::{Concurrency, OnConflict};

/// How long a member whose group is full waits before it tries again.
pub const RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// One member's wait for a slot of its group, over as many tries as it takes.
#[derive(Debug)]
pub struct GroupWait {
    concurrency: Concurrency,
    /// What holds a slot, for the messages: "run" or "node run".
    member: &'static str,
    /// Holders already sent a cancel (`cancel-running`), by process id.
    cancelled: HashSet<u32>,
}

/// How one try ended.
#[derive(Debug)]
pub enum Turn {
    /// A slot, held until dropped.
    Took(GroupSlot),
    /// The group is full: why, naming its holders, and the holders this try sent a cancel
    /// (`cancel-running`); the member waits and tries again.
    Full { why: String, cancelled: Vec<u32> },
    /// The group is full and `on_conflict = "refuse"`: why, for the member to end with.
    Refused(String),
}

impl GroupWait {
    pub fn new(concurrency: &Concurrency, member: &'static str) -> Self {
        Self {
            concurrency: concurrency.clone(),
            member,
            cancelled: HashSet::new(),
        }
    }

    pub fn group(&self) -> &str {
        &self.concurrency.group
    }

    /// Tries for a slot on `ledger`'s locks. With the group full and `cancel-running`, the
    /// holders are sent SIGTERM (a kavi run takes it as a cancel), once each; this process
    /// itself never is (its own nodes of the group end by themselves).
    pub fn try_take(&mut self, ledger: &Path) -> std::io::Result<Turn> {
        let group = &self.concurrency.group;
        let limit = self.concurrency.limit.get();
        let holders = match try_take(ledger, group, limit)? {
            Ok(slot) => return Ok(Turn::Took(slot)),
            Err(holders) => holders,
        };
        let held_by: Vec<String> = holders.iter().map(u32::to_string).collect();
        let full = format!(
            "concurrency group `{group}` is full: {limit} {}(s) at once, held by kavi process {}",
            self.member,
            held_by.join(", ")
        );
        let mut cancelled = Vec::new();
        match self.concurrency.on_conflict {
            OnConflict::Refuse => return Ok(Turn::Refused(full)),
            OnConflict::CancelRunning => {
                let own = std::process::id();
                for pid in holders {
                    if pid == own || !self.cancelled.insert(pid) {
                        continue;
                    }
                    let target = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap_or(i32::MAX));
                    // One that has ended meanwhile needs no cancel.
                    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
                    cancelled.push(pid);
                }
            }
            OnConflict::Queue => {}
        }
        Ok(Turn::Full {
            why: full,
            cancelled,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn concurrency(on_conflict: OnConflict) -> Concurrency {
        Concurrency {
            group: "deploy".into(),
            limit: std::num::NonZeroU32::MIN,
            on_conflict,
        }
    }

    #[test]
    fn a_full_group_is_waited_for_or_refused_and_its_holder_named() {
        let dir = tempfile::tempdir().unwrap();
        let ledger = dir.path().join("ledger.db");
        let mut first = GroupWait::new(&concurrency(OnConflict::Queue), "node run");
        let Turn::Took(slot) = first.try_take(&ledger).unwrap() else {
            panic!("an empty group has a slot");
        };
        let pid = std::process::id();
        let full = format!(
            "concurrency group `deploy` is full: 1 node run(s) at once, held by kavi process {pid}"
        );
        let mut queued = GroupWait::new(&concurrency(OnConflict::Queue), "node run");
        assert!(matches!(queued.try_take(&ledger).unwrap(), Turn::Full { why, .. } if why == full));
        let mut refused = GroupWait::new(&concurrency(OnConflict::Refuse), "node run");
        assert!(matches!(refused.try_take(&ledger).unwrap(), Turn::Refused(why) if why == full));
        // Its own process is never cancelled: this test is still here to see the group full.
        let mut cancelling = GroupWait::new(&concurrency(OnConflict::CancelRunning), "node run");
        assert!(matches!(
            cancelling.try_take(&ledger).unwrap(),
            Turn::Full { cancelled, .. } if cancelled.is_empty()
        ));
        drop(slot);
        assert!(matches!(queued.try_take(&ledger).unwrap(), Turn::Took(_)));
    }
}
