//! A lease held in the ledger and renewed while its holder works: a step's claim on a node's
//! attempt ([`crate::executor::step`]) and a concurrency group's slot on a server's ledger
//! ([`crate::groups`]). Renewed every third of the lease on a thread and a connection of its
//! own, so a busy loop or a long node never lets it run out; should the lease stop being the
//! holder's, what it guards is stopped.

use std::sync::mpsc;
use std::thread::JoinHandle;

use crate::ledger::{AnotherConnection, Ledger, LedgerError};

/// What one renewal found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Beat {
    /// Still the holder's.
    Held,
    /// No longer the holder's to keep, for this reason: the holder is stopped.
    Lost(&'static str),
}

/// A lease renewed until dropped; then released.
pub struct Heartbeat {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Heartbeat {
    /// Renews a lease on `connection` with `renew` every third of the lease; calls `lost` (once,
    /// then renews no more) when a renewal finds it no longer held, and `release` once dropped.
    /// A renewal that fails is tried again at the next beat: the lease holds a while yet.
    pub fn start(
        connection: AnotherConnection,
        what: String,
        mut renew: impl FnMut(&Ledger) -> Result<Beat, LedgerError> + Send + 'static,
        lost: impl FnOnce(&'static str) + Send + 'static,
        release: impl FnOnce(&Ledger) + Send + 'static,
    ) -> Heartbeat {
        let (stop, stopped) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("kavi-heartbeat".into())
            .spawn(move || {
                let ledger = match connection.open() {
                    Ok(ledger) => ledger,
                    Err(e) => {
                        tracing::warn!(error = %e, "the lease of {what} cannot be renewed");
                        return;
                    }
                };
                let mut lost = Some(lost);
                while let Err(mpsc::RecvTimeoutError::Timeout) =
                    stopped.recv_timeout(crate::ledger::lease() / 3)
                {
                    if lost.is_none() {
                        continue;
                    }
                    match renew(&ledger) {
                        Ok(Beat::Held) => {}
                        Ok(Beat::Lost(why)) => {
                            tracing::warn!("{what}: {why}");
                            if let Some(lost) = lost.take() {
                                lost(why);
                            }
                        }
                        Err(e) => tracing::warn!(error = %e, "the lease of {what} was not renewed"),
                    }
                }
                release(&ledger);
            })
            .expect("a thread can be started");
        Heartbeat {
            stop: Some(stop),
            thread: Some(thread),
        }
    }
}

impl Drop for Heartbeat {
    fn drop(&mut self) {
        self.stop = None;
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl std::fmt::Debug for Heartbeat {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Heartbeat")
    }
}
