//! What a run or a node attempt does when it asks its concurrency group for a slot (see
//! [`crate::ledger::concurrency`]): takes one, or, with the group full, does what its
//! `on_conflict` says. Pipelines (`[pipeline] concurrency`) and nodes (`concurrency`) both go
//! through [`GroupWait`], so a group is one semaphore whoever names it. On a ledger file the
//! slots are lock files of this machine's; on a server's ledger they are leases in the ledger,
//! which every machine sharing it takes from.

use std::collections::HashSet;

use crate::heartbeat::{Beat, Heartbeat};
use crate::ledger::concurrency::{self, LeasedSlot, Renewal};
use crate::ledger::{Ledger, LedgerError};
use crate::spec::{Concurrency, OnConflict};

/// How long a member whose group is full waits before it tries again.
pub const RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// A slot of a group, held until dropped.
#[derive(Debug)]
pub enum Slot {
    /// A lock file of this machine's, held open.
    Locked(concurrency::GroupSlot),
    /// A lease in a server's ledger, renewed until dropped, then released.
    Leased(Heartbeat),
}

/// One member's wait for a slot of its group, over as many tries as it takes.
#[derive(Debug)]
pub struct GroupWait {
    concurrency: Concurrency,
    /// What holds a slot, for the messages: "run" or "node run".
    member: &'static str,
    /// Holders already asked to make way (`cancel-running`): process ids on a ledger file,
    /// `pid@host` on a server's.
    cancelled: HashSet<String>,
}

/// How one try ended.
#[derive(Debug)]
pub enum Turn {
    /// A slot, held until dropped.
    Took(Slot),
    /// The group is full: why, naming its holders, and the holders this try asked to make way
    /// (`cancel-running`); the member waits and tries again.
    Full { why: String, cancelled: Vec<String> },
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

    /// Tries for a slot of `ledger`'s. With the group full and `cancel-running`, each holder is
    /// asked once to make way: sent SIGTERM on this machine (a kavi run takes it as a cancel),
    /// its slot marked on a server's ledger (its holder sends itself SIGTERM when it next
    /// renews it). This process itself never is (its own nodes of the group end by themselves).
    pub fn try_take(&mut self, ledger: &mut Ledger) -> Result<Turn, LedgerError> {
        let group = self.concurrency.group.clone();
        let limit = self.concurrency.limit.get();
        let (own, holders) = match ledger.group_locks() {
            Some(locks) => match concurrency::try_take(locks, &group, limit)? {
                Ok(slot) => return Ok(Turn::Took(Slot::Locked(slot))),
                Err(pids) => (
                    std::process::id().to_string(),
                    pids.iter().map(u32::to_string).collect::<Vec<_>>(),
                ),
            },
            None => {
                let own = concurrency::holder_name();
                match ledger.take_group_slot(&group, limit, &own)? {
                    Ok(slot) => {
                        let connection = ledger.another_connection()?;
                        return Ok(Turn::Took(Slot::Leased(lease(connection, slot))));
                    }
                    Err(holders) => (own, holders),
                }
            }
        };
        let full = format!(
            "concurrency group `{group}` is full: {limit} {}(s) at once, held by kavi process {}",
            self.member,
            holders.join(", ")
        );
        let mut cancelled = Vec::new();
        match self.concurrency.on_conflict {
            OnConflict::Refuse => return Ok(Turn::Refused(full)),
            OnConflict::CancelRunning => {
                for holder in holders {
                    if holder == own || !self.cancelled.insert(holder.clone()) {
                        continue;
                    }
                    match holder.parse::<i32>() {
                        Ok(pid) => {
                            // One that has ended meanwhile needs no cancel.
                            let target = nix::unistd::Pid::from_raw(pid);
                            let _ =
                                nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGTERM);
                        }
                        Err(_) => ledger.ask_to_make_way(&group, &holder)?,
                    }
                    cancelled.push(holder);
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

/// Holds `slot` of a server's ledger until dropped: renewed on `connection`, then released.
/// Asked to make way, or lost (its lease ran out while the ledger could not be reached, and
/// another took it), it sends this process SIGTERM, as another kavi of the group does on one
/// machine: a kavi run takes it as a cancel.
fn lease(connection: crate::ledger::AnotherConnection, slot: LeasedSlot) -> Heartbeat {
    let what = format!("concurrency group `{}`'s slot {}", slot.group, slot.slot);
    let renewed = slot.clone();
    Heartbeat::start(
        connection,
        what,
        move |ledger| {
            Ok(match ledger.renew_group_slot(&renewed)? {
                Renewal::Held => Beat::Held,
                Renewal::MakeWay => Beat::Lost(
                    "another kavi of the group asked this one to make way (cancel-running): \
                     the run is cancelled",
                ),
                Renewal::Lost => {
                    Beat::Lost("its lease ran out and another kavi took it: the run is cancelled")
                }
            })
        },
        |_| {
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
        },
        move |ledger| {
            if let Err(e) = ledger.release_group_slot(&slot) {
                // Its lease frees it when it runs out.
                tracing::warn!(error = %e, "a concurrency group's slot was not released");
            }
        },
    )
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
        let (_dir, mut ledger, _owner) = crate::ledger::testing::fresh_ledger();
        let mut first = GroupWait::new(&concurrency(OnConflict::Queue), "node run");
        let Turn::Took(slot) = first.try_take(&mut ledger).unwrap() else {
            panic!("an empty group has a slot");
        };
        let pid = std::process::id();
        let full = format!(
            "concurrency group `deploy` is full: 1 node run(s) at once, held by kavi process {pid}"
        );
        let mut queued = GroupWait::new(&concurrency(OnConflict::Queue), "node run");
        assert!(
            matches!(queued.try_take(&mut ledger).unwrap(), Turn::Full { why, .. } if why == full)
        );
        let mut refused = GroupWait::new(&concurrency(OnConflict::Refuse), "node run");
        assert!(
            matches!(refused.try_take(&mut ledger).unwrap(), Turn::Refused(why) if why == full)
        );
        // Its own process is never cancelled: this test is still here to see the group full.
        let mut cancelling = GroupWait::new(&concurrency(OnConflict::CancelRunning), "node run");
        assert!(matches!(
            cancelling.try_take(&mut ledger).unwrap(),
            Turn::Full { cancelled, .. } if cancelled.is_empty()
        ));
        drop(slot);
        assert!(matches!(
            queued.try_take(&mut ledger).unwrap(),
            Turn::Took(_)
        ));
    }
}
