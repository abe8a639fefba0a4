//! Claims on node attempts: a step (`kavi pipeline step`) runs an attempt only once the ledger
//! gave it the attempt's row, in one statement that one claimant wins, on SQLite and on a server
//! alike (an insert that, on the row's key, takes it over only while it is `pending`). The claim
//! holds for a lease its step renews while the node runs; another step finds the attempt
//! `running`, claimed, and waits for it, or takes over once the lease has run out (its claimant
//! died, or its machine did).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use super::db::{OptionalExtension, params};
use super::{Ledger, Result, format_time};

/// How long a claim (and a run's lease) holds without being renewed, by default; its holder
/// renews it every third of it.
pub const DEFAULT_LEASE: Duration = Duration::from_secs(30);

/// The lease this kavi takes, in milliseconds: kavi.toml's `lease`.
static LEASE_MS: AtomicU64 = AtomicU64::new(DEFAULT_LEASE.as_millis() as u64);

/// Sets the lease this kavi takes, from the workspace's configuration. Each lease is recorded
/// with its end, so machines set up with other leases read one another's rightly.
pub fn set_lease(lease: Duration) {
    LEASE_MS.store(
        u64::try_from(lease.as_millis()).unwrap_or(u64::MAX),
        Ordering::Relaxed,
    );
}

/// How long a lease this kavi takes holds without being renewed (see [`set_lease`]).
pub fn lease() -> Duration {
    Duration::from_millis(LEASE_MS.load(Ordering::Relaxed))
}

/// Who got an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// This claimant: it runs the attempt.
    Won,
    /// Another, whose lease runs until `until`.
    Held { by: String, until: String },
}

pub(crate) fn lease_end(lease: Duration) -> String {
    format_time(jiff::Timestamp::now() + lease)
}

/// Whether a lease that ran until `until` is over (or cannot be read, as a claim that never
/// had one).
pub fn lease_over(until: Option<&str>) -> bool {
    until
        .and_then(|until| until.parse::<jiff::Timestamp>().ok())
        .is_none_or(|until| until <= jiff::Timestamp::now())
}

impl Ledger {
    /// Renews the lease of run `run_id`, which this kavi runs: while it holds, no kavi on
    /// another machine takes the run for abandoned.
    pub fn renew_run_lease(&self, run_id: i64) -> Result<()> {
        self.conn
            .prepare_cached(
                "UPDATE runs SET lease_until = ?1 WHERE id = ?2 AND status = 'running'",
            )?
            .execute(params![lease_end(lease()), run_id])?;
        Ok(())
    }

    /// Claims attempt `attempt` of `node_id` in run `run_id` for `claimant`: its row becomes
    /// `running` (made, or taken over from `pending`), unless another claimant has it.
    pub fn claim_attempt(
        &self,
        run_id: i64,
        node_id: &str,
        kind: &str,
        attempt: u32,
        claimant: &str,
    ) -> Result<Claim> {
        let won: Option<i64> = self
            .conn
            .prepare_cached(
                "INSERT INTO node_runs (run_id, node_id, kind, state, attempt, governing_hash,
                                        claimed_by, lease_until)
                 VALUES (?1, ?2, ?3, 'running', ?4, (SELECT governing_hash FROM runs WHERE id = ?1),
                         ?5, ?6)
                 ON CONFLICT (run_id, node_id, attempt)
                 DO UPDATE SET state = 'running', claimed_by = excluded.claimed_by,
                               lease_until = excluded.lease_until
                 WHERE node_runs.state = 'pending'
                 RETURNING id",
            )?
            .query_row(
                params![run_id, node_id, kind, attempt, claimant, lease_end(lease())],
                |row| row.get(0),
            )
            .optional()?;
        if won.is_some() {
            return Ok(Claim::Won);
        }
        let (by, until) = self.claim_on(run_id, node_id, attempt)?.unwrap_or_default();
        Ok(Claim::Held { by, until })
    }

    /// Who holds attempt `attempt` of `node_id` and until when, when a step claimed it.
    pub fn claim_on(
        &self,
        run_id: i64,
        node_id: &str,
        attempt: u32,
    ) -> Result<Option<(String, String)>> {
        Ok(self
            .conn
            .prepare_cached(
                "SELECT claimed_by, lease_until FROM node_runs
                 WHERE run_id = ?1 AND node_id = ?2 AND attempt = ?3 AND claimed_by IS NOT NULL",
            )?
            .query_row(params![run_id, node_id, attempt], |row| {
                Ok((
                    row.get(0)?,
                    row.get::<_, Option<String>>(1)?.unwrap_or_default(),
                ))
            })
            .optional()?)
    }

    /// Renews `claimant`'s lease on an attempt it runs; `false` once the attempt is no longer its
    /// own to run (it ended, or another step took it over after the lease ran out).
    pub fn renew_claim(
        &self,
        run_id: i64,
        node_id: &str,
        attempt: u32,
        claimant: &str,
    ) -> Result<bool> {
        let renewed = self
            .conn
            .prepare_cached(
                "UPDATE node_runs SET lease_until = ?1
                 WHERE run_id = ?2 AND node_id = ?3 AND attempt = ?4 AND claimed_by = ?5
                   AND state = 'running'",
            )?
            .execute(params![
                lease_end(lease()),
                run_id,
                node_id,
                attempt,
                claimant
            ])?;
        Ok(renewed > 0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NodeRecord;
    use crate::testing::{fresh_ledger, new_run};
    use kavi_foundation::state::NodeState;

    #[test]
    fn an_attempt_is_claimed_once_renewed_by_its_claimant_and_ended_once() {
        let (_dir, mut ledger, owner) = fresh_ledger();
        let run = ledger
            .create_run(&new_run(&serde_json::json!({}), &["a"], &owner))
            .unwrap();
        // The pending first attempt, then a retry's row that does not exist yet.
        for attempt in [1, 2] {
            assert_eq!(
                ledger
                    .claim_attempt(run, "a", "exec", attempt, "1-1@one")
                    .unwrap(),
                Claim::Won
            );
            let Claim::Held { by, until } = ledger
                .claim_attempt(run, "a", "exec", attempt, "2-2@two")
                .unwrap()
            else {
                panic!("a claimed attempt was claimed again");
            };
            assert_eq!(by, "1-1@one");
            assert!(!lease_over(Some(&until)));
            assert!(ledger.renew_claim(run, "a", attempt, "1-1@one").unwrap());
            assert!(!ledger.renew_claim(run, "a", attempt, "2-2@two").unwrap());
            for (state, code) in [(NodeState::Failed, 1), (NodeState::Succeeded, 0)] {
                // The second end changes nothing.
                let record = NodeRecord {
                    exit_code: Some(code),
                    ..Default::default()
                };
                ledger
                    .finish_node(run, "a", attempt, state, &record)
                    .unwrap();
            }
            let rows = ledger.run_detail(run).unwrap().nodes;
            let row = rows
                .iter()
                .find(|r| r.attempt == i64::from(attempt))
                .unwrap();
            assert_eq!((row.state, row.exit_code), (NodeState::Failed, Some(1)));
            // Over: its lease is not renewed.
            assert!(!ledger.renew_claim(run, "a", attempt, "1-1@one").unwrap());
        }
        assert!(lease_over(None));
    }
}
