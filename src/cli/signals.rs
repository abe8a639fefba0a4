//! Cancelling on SIGINT, SIGTERM and SIGHUP, and the exit code a cancelled command ends with.

use crate::error::exit;

/// The signal that stopped kavi, once one has (see [`cancel_on_signals`]).
static STOPPED_BY: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// The exit code of a cancelled run or skill: 128 + the signal that cancelled it, as shells
/// report it (130 for Ctrl-C, 143 for SIGTERM, 129 for SIGHUP).
pub(crate) fn cancelled_exit_code() -> i32 {
    match STOPPED_BY.load(std::sync::atomic::Ordering::SeqCst) {
        0 => exit::CANCELLED,
        signal => 128 + signal,
    }
}

/// A token that the first SIGINT (Ctrl-C), SIGTERM (what `timeout`, `docker stop` and CI
/// cancellation send) or SIGHUP cancels, so what is running (nodes, a skill: each in its own
/// process group, out of the terminal's reach) is stopped and recorded; a second signal quits at
/// once. `what` names what is stopped, for the message.
pub(super) fn cancel_on_signals(what: &'static str) -> tokio_util::sync::CancellationToken {
    use tokio::signal::unix::{SignalKind, signal};
    let cancel = tokio_util::sync::CancellationToken::new();
    let on_signal = cancel.clone();
    // Registered now, before anything starts, so that an early signal is not lost.
    let mut streams = Signals {
        interrupt: signal(SignalKind::interrupt()).ok(),
        terminate: signal(SignalKind::terminate()).ok(),
        hangup: signal(SignalKind::hangup()).ok(),
    };
    tokio::spawn(async move {
        let first = streams.next().await;
        STOPPED_BY.store(first, std::sync::atomic::Ordering::SeqCst);
        errln!(
            "cancelling: stopping {what} (send the signal again, or press Ctrl-C, to quit at once)"
        );
        on_signal.cancel();
        let second = streams.next().await;
        // A run left unfinished shows as interrupted on the next start.
        std::process::exit(128 + second);
    });
    cancel
}

/// The signals that cancel a run; a stream that could not be registered never fires.
struct Signals {
    interrupt: Option<tokio::signal::unix::Signal>,
    terminate: Option<tokio::signal::unix::Signal>,
    hangup: Option<tokio::signal::unix::Signal>,
}

impl Signals {
    /// Waits for the next of them; returns its number.
    pub(super) async fn next(&mut self) -> i32 {
        async fn recv(stream: &mut Option<tokio::signal::unix::Signal>) {
            let received = match stream {
                Some(stream) => stream.recv().await.is_some(),
                None => false,
            };
            if !received {
                std::future::pending::<()>().await;
            }
        }
        tokio::select! {
            () = recv(&mut self.interrupt) => nix::libc::SIGINT,
            () = recv(&mut self.terminate) => nix::libc::SIGTERM,
            () = recv(&mut self.hangup) => nix::libc::SIGHUP,
        }
    }
}
