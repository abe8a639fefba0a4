//! Recovery: finding the kavi processes of this machine that died with runs unfinished, stopping
//! what they left running and marking what they left `interrupted`.

use std::fs::File;
use std::path::{Path, PathBuf};

use super::db::{self, params};
use super::{Ledger, Result, now, owner};

/// Takes the lock on the file at `path` for a recovery, if nobody holds it: `None` when its
/// owner (or another recovery of it) does, or when this account may not open it (another
/// account's, in a shared ledger: its own recovery will see to it); no file when there is none.
/// With `placeholder`, a missing file is made (as lock files are, closed to the accounts that
/// may not write the folder; never through a link) and its lock taken, so that a second
/// recovery finds the owner held.
fn take_over(path: &Path, placeholder: bool) -> std::io::Result<Option<Option<File>>> {
    let opened = match File::open(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && placeholder => {
            use std::os::unix::fs::OpenOptionsExt as _;
            std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .custom_flags(nix::libc::O_NOFOLLOW)
                .mode(0o666 & !kavi_foundation::sandbox::closed_bits(path))
                .open(path)
        }
        other => other,
    };
    match opened {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Some(None)),
        // Made by another recovery at this moment, or another account's.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::AlreadyExists | std::io::ErrorKind::PermissionDenied
            ) =>
        {
            Ok(None)
        }
        Err(e) => Err(e),
        Ok(file) => match file.try_lock() {
            Ok(()) => Ok(Some(Some(file))),
            Err(std::fs::TryLockError::WouldBlock) => Ok(None),
            Err(std::fs::TryLockError::Error(e)) => Err(e),
        },
    }
}

/// Why an owner's runs are taken for abandoned.
enum Lapsed<'a> {
    /// Its lock on this machine is free; what it said when it stopped, if it could.
    Note(Option<&'a str>),
    /// Its lease, on another machine, ran out before this time.
    Since(&'a str),
}

/// What recovery found of one dead owner and did about it.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Recovered {
    pub owner: String,
    /// Runs it marked interrupted.
    pub runs: Vec<i64>,
    /// Leftover processes it stopped.
    pub killed: usize,
}

impl Ledger {
    fn owner_file(&self, owner: &str, extension: &str) -> PathBuf {
        self.locks_dir.join(format!("{owner}.{extension}"))
    }

    /// Finds owners that died without cleaning up (their lock is free while their files or their
    /// unfinished rows remain), stops what they left running, marks their runs, node runs, builds
    /// and executions `interrupted` in one transaction per owner, and removes their files.
    pub fn recover_interrupted(&mut self) -> Result<Vec<Recovered>> {
        // Which owners are dead is decided in the exclusive turn, so that no claim is seen half
        // made; each dead owner's locks are then held by this recovery, so that another sees it
        // alive and leaves it to this one. The turn is given back before the slow part (stopping
        // what they left, the ledger's writes, removing their files): claims wait only
        // milliseconds for it.
        let dead = {
            let _turn = owner::take_turn(&self.locks_dir, true)?;
            self.dead_owners()?
        };
        let mut recovered = self.recover_lapsed_leases()?;
        for (name, _held) in dead {
            let leftovers = match kavi_process::roster::stop_leftovers(
                &self.owner_file(&name, owner::ROSTER),
            ) {
                Ok(leftovers) => leftovers,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => Default::default(),
                Err(e) => return Err(e.into()),
            };
            let note = owner::stop_note(&self.owner_file(&name, owner::LOCKS[0]));
            let runs = self.mark_interrupted(&name, Lapsed::Note(note.as_deref()))?;
            if let Some(spill) = leftovers.spill {
                owner::remove_spill(&name, &spill);
            }
            for folder in &leftovers.folders {
                owner::remove_private_folder(folder);
            }
            // The lock goes last: were this recovery cut short, the next finds it free and redoes it.
            for extension in [owner::ROSTER, owner::LOCKS[1], owner::LOCKS[0]] {
                let _ = std::fs::remove_file(self.owner_file(&name, extension));
            }
            if let Some(note) = &note
                && !runs.is_empty()
            {
                tracing::warn!(
                    owner = %name,
                    runs = ?runs,
                    "a kavi process stopped before it finished ({note}): its runs are marked \
                     interrupted"
                );
            } else if !runs.is_empty() || leftovers.killed > 0 {
                tracing::warn!(
                    owner = %name,
                    runs = ?runs,
                    stopped = leftovers.killed,
                    "a kavi process was killed before it finished: its runs are marked \
                     interrupted and the processes it left running were stopped"
                );
                recovered.push(Recovered {
                    owner: name,
                    runs,
                    killed: leftovers.killed,
                });
            }
        }
        Ok(recovered)
    }

    /// The owners of this machine whose locks are free while their files or unfinished rows
    /// remain, each with its locks, now held.
    pub(crate) fn dead_owners(&self) -> Result<Vec<(String, Vec<File>)>> {
        let mut owners = std::collections::BTreeSet::new();
        for entry in std::fs::read_dir(&self.locks_dir)? {
            let path = entry?.path();
            if let Some(name) = owner::name_of(&path) {
                owners.insert(name.to_owned());
            }
        }
        // Rows whose owner's files are gone already: an older kavi, or a recovery cut short.
        {
            let mut stmt = self.conn.prepare(
                "SELECT owner FROM runs WHERE status = 'running'
                 UNION SELECT owner FROM executions WHERE status = 'running' AND owner IS NOT NULL",
            )?;
            for owner in stmt.query_map([], |row| row.get::<_, String>(0))? {
                let owner = owner?;
                // A name is a file's in the locks folder: never one that could name another.
                if owner::well_formed(&owner) {
                    owners.insert(owner);
                }
            }
        }
        owners.remove(owner::EXTERNAL);
        // A shared ledger names owners on other machines: only this one's can be checked. The
        // others' runs are recovered once their leases have run out (see `recover_lapsed_leases`).
        let on_server = self.conn.backend() == db::Backend::Postgres;
        let mut dead = Vec::new();
        'owners: for name in owners.into_iter().filter(|name| owner::runs_here(name)) {
            // A server's ledger keeps its owners' locks in a folder of each account's cache: a
            // kavi of this machine with another account, or another cache home (one a node
            // runs, with the node's environment), keeps them elsewhere. Its process is then
            // what says it is alive.
            if on_server
                && !self.owner_file(&name, owner::LOCKS[0]).exists()
                && owner::still_running(&name)
            {
                continue;
            }
            let mut held = Vec::new();
            for extension in owner::LOCKS {
                // An owner known only from its rows has no lock file: a placeholder, held, is
                // what tells another recovery that this one acts on it. (A live owner's lock file
                // always exists: its claim, made in a turn, is complete in this one.)
                let placeholder = extension == owner::LOCKS[0];
                match take_over(&self.owner_file(&name, extension), placeholder)? {
                    None => continue 'owners,
                    Some(lock) => held.extend(lock),
                }
            }
            dead.push((name, held));
        }
        Ok(dead)
    }

    /// Marks interrupted the runs of other machines whose leases have run out: their kavi died,
    /// or was cut off from the ledger for longer than a lease, so no kavi renews them. What
    /// they left running on their machine is stopped when that machine's kavi comes back (its
    /// owner's lock is free then, above). Runs without a lease (an older kavi's) are left alone.
    fn recover_lapsed_leases(&mut self) -> Result<Vec<Recovered>> {
        let now = now();
        let mut owners = std::collections::BTreeSet::new();
        {
            let mut stmt = self.conn.prepare(
                "SELECT owner FROM runs
                 WHERE status = 'running' AND lease_until IS NOT NULL AND lease_until < ?1",
            )?;
            for owner in stmt.query_map(params![now], |row| row.get::<_, String>(0))? {
                owners.insert(owner?);
            }
        }
        let mut recovered = Vec::new();
        for name in owners.into_iter().filter(|name| !owner::runs_here(name)) {
            let runs = self.mark_interrupted(&name, Lapsed::Since(&now))?;
            if !runs.is_empty() {
                tracing::warn!(
                    owner = %name,
                    runs = ?runs,
                    "the kavi process running these runs on another machine stopped renewing \
                     their lease: they are marked interrupted"
                );
                recovered.push(Recovered {
                    owner: name,
                    runs,
                    killed: 0,
                });
            }
        }
        Ok(recovered)
    }

    /// Marks what `owner` left unfinished as interrupted, in one transaction, saying why it
    /// stopped; returns the runs.
    fn mark_interrupted(&mut self, owner: &str, why: Lapsed<'_>) -> Result<Vec<i64>> {
        let now = now();
        let (why, lapsed) = match why {
            Lapsed::Note(note) => (
                note.map_or_else(String::new, |note| format!(": {note}")),
                None,
            ),
            Lapsed::Since(at) => (
                format!(": its lease ran out before {at}, on another machine"),
                Some(at),
            ),
        };
        let run_error = format!("the kavi process running it stopped before it finished{why}");
        let node_reason = format!("the kavi process stopped while this node was unfinished{why}");
        let tx = self.conn.transaction()?;
        let runs = match lapsed {
            None => tx
                .prepare(
                    "UPDATE runs SET status = 'interrupted', finished_at = ?1, error = ?3
                     WHERE owner = ?2 AND status = 'running' RETURNING id",
                )?
                .query_map(params![now, owner, run_error], |row| row.get::<_, i64>(0))?
                .collect::<db::Result<Vec<i64>>>()?,
            // Only the runs whose lease lapsed: decided again under the write lock.
            Some(at) => tx
                .prepare(
                    "UPDATE runs SET status = 'interrupted', finished_at = ?1, error = ?3
                     WHERE owner = ?2 AND status = 'running' AND lease_until < ?4 RETURNING id",
                )?
                .query_map(params![now, owner, run_error, at], |row| {
                    row.get::<_, i64>(0)
                })?
                .collect::<db::Result<Vec<i64>>>()?,
        };
        for run_id in &runs {
            tx.execute(
                "UPDATE node_runs SET state = 'interrupted', finished_at = ?1, reason = ?3
                 WHERE run_id = ?2 AND state IN ('pending', 'running')",
                params![now, run_id, node_reason],
            )?;
            tx.execute(
                "UPDATE builds SET status = 'interrupted', finished_at = ?1
                 WHERE run_id = ?2 AND status = 'running'",
                params![now, run_id],
            )?;
        }
        // Executions hold no lease: another machine's are its own kavi's to recover.
        if lapsed.is_none() {
            tx.execute(
                "UPDATE executions SET status = 'interrupted', finished_at = ?1, error = ?3
                 WHERE owner = ?2 AND status = 'running'",
                params![now, owner, run_error],
            )?;
        }
        tx.commit()?;
        Ok(runs)
    }
}
