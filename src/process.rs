//! The one place kavi starts processes.
//!
//! Each child leads a new process group, so a timeout or a cancel can signal everything it
//! started (a shell's children, a test runner's workers) and not only the child itself. When the
//! child exits, whatever it left behind in its group is killed too: a node's processes never
//! outlive the node.

use std::io;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt;
use tokio_util::sync::CancellationToken;

/// How long a cancelled process group gets between SIGTERM and SIGKILL.
const TERMINATE_GRACE: Duration = Duration::from_secs(2);

/// A fully resolved command: nothing here is a template any more.
#[derive(Debug, Clone)]
pub struct CommandSpec {
    pub program: String,
    pub args: Vec<String>,
    /// The complete environment; the child inherits nothing else.
    pub env: Vec<(String, String)>,
    pub cwd: PathBuf,
    pub stdin: Option<Vec<u8>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Code(i32),
    Signal(i32),
    /// Stopped because the cancel token fired.
    Cancelled,
}

/// Kills the whole group when dropped, whatever path the caller took out.
struct GroupGuard(Pid);

impl Drop for GroupGuard {
    fn drop(&mut self) {
        let _ = killpg(self.0, Signal::SIGKILL);
    }
}

/// Runs a command to completion, its output going to the given files.
pub async fn run(
    spec: &CommandSpec,
    stdout: std::fs::File,
    stderr: std::fs::File,
    cancel: &CancellationToken,
) -> io::Result<Exit> {
    let mut command = tokio::process::Command::new(&spec.program);
    command
        .args(&spec.args)
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd)
        .stdin(if spec.stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(stdout)
        .stderr(stderr)
        .process_group(0)
        .kill_on_drop(true);
    #[cfg(target_os = "linux")]
    // SAFETY: between fork and exec only async-signal-safe calls are allowed; prctl is one.
    unsafe {
        // If kavi itself is killed (kill -9), its direct children die with it instead of
        // running on unobserved.
        command
            .pre_exec(|| nix::sys::prctl::set_pdeathsig(Signal::SIGKILL).map_err(io::Error::from));
    }
    let mut child = command.spawn()?;
    tracing::debug!(program = %spec.program, args = ?spec.args, cwd = %spec.cwd.display(), "spawned");
    let pid = child
        .id()
        .and_then(|id| i32::try_from(id).ok())
        .ok_or_else(|| io::Error::other("the child exited before its pid was read"))?;
    let group = GroupGuard(Pid::from_raw(pid));

    if let (Some(bytes), Some(mut pipe)) = (spec.stdin.clone(), child.stdin.take()) {
        // A child that does not read its stdin closes the pipe; that is not an error.
        tokio::spawn(async move {
            let _ = pipe.write_all(&bytes).await;
        });
    }

    let status = tokio::select! {
        status = child.wait() => status?,
        () = cancel.cancelled() => {
            let _ = killpg(group.0, Signal::SIGTERM);
            if tokio::time::timeout(TERMINATE_GRACE, child.wait()).await.is_err() {
                let _ = killpg(group.0, Signal::SIGKILL);
                child.wait().await?;
            }
            return Ok(Exit::Cancelled);
        }
    };
    drop(group);
    use std::os::unix::process::ExitStatusExt;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => Exit::Code(code),
        (None, Some(signal)) => Exit::Signal(signal),
        (None, None) => Exit::Code(-1),
    })
}
