//! The bridge inside a network profile's view: kavi's own binary, run by bubblewrap in place of
//! the program, as `kavi __kavi-proxy-bridge PORT SOCKET -- PROGRAM ARGS...`.
//!
//! It listens on `127.0.0.1:PORT` of the view's own loopback, forwards each connection to the
//! proxy's unix socket, runs the program as its child, and exits with the program's status
//! (128 + the signal, for a program killed by one, as bubblewrap reports it). It runs under the
//! same namespaces, seccomp programs, Landlock rules and bounds as the program: it holds
//! nothing the program could not have itself.
//!
//! kavi's own binary rather than socat (what Anthropic's sandbox runtime runs): nothing to
//! install, and nothing found on a PATH a workspace could shadow. Which binary: the one kavi
//! runs as (registered by `main`), or one given with [`set_program`], or, for a test binary of
//! this crate in `target/<profile>/deps`, the `kavi` cargo built beside it.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The first argument that makes kavi a bridge.
pub const SUBCOMMAND: &str = "__kavi-proxy-bridge";

/// Where the binary is mounted in the view.
pub const PROGRAM_IN_VIEW: &str = "/run/kavi/bridge";

static PROGRAM: OnceLock<PathBuf> = OnceLock::new();

/// Names the binary that runs as the bridge (the kavi binary itself, or one a test names with
/// `CARGO_BIN_EXE_kavi`). The first call wins.
pub fn set_program(path: impl Into<PathBuf>) {
    let _ = PROGRAM.set(path.into());
}

/// The binary that runs as the bridge, or why none can be found.
pub fn program() -> Result<PathBuf, String> {
    if let Some(path) = PROGRAM.get() {
        return Ok(path.clone());
    }
    let exe = std::env::current_exe()
        .map_err(|e| format!("cannot find kavi's binary for the network bridge: {e}"))?;
    // A test binary of this crate, in target/<profile>/deps: the kavi binary beside that folder.
    let beside = exe
        .parent()
        .filter(|dir| dir.file_name().is_some_and(|n| n == "deps"))
        .and_then(Path::parent)
        .map(|dir| dir.join("kavi"))
        .filter(|path| path.is_file());
    beside.ok_or_else(|| {
        format!(
            "cannot find kavi's binary for the network bridge: {} is not kavi, and no kavi was \
             built beside it (run through the kavi binary, or call \
             kavi::confinement::bridge::set_program)",
            exe.display()
        )
    })
}

/// Runs the bridge with the arguments after [`SUBCOMMAND`]; returns the exit code.
pub fn main(args: Vec<OsString>) -> i32 {
    match run(args) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("kavi's network bridge: {e}");
            125
        }
    }
}

fn run(args: Vec<OsString>) -> Result<i32, String> {
    let mut args = args.into_iter();
    let port: u16 = args
        .next()
        .and_then(|p| p.to_str()?.parse().ok())
        .ok_or("usage: PORT SOCKET -- PROGRAM ARGS...")?;
    let socket = PathBuf::from(args.next().ok_or("no socket")?);
    if args.next().is_none_or(|dash| dash != "--") {
        return Err("usage: PORT SOCKET -- PROGRAM ARGS...".into());
    }
    let program = args.next().ok_or("no program")?;
    // Not readable or traceable through /proc by the program it runs.
    let _ = nix::sys::prctl::set_dumpable(false);
    let listener = std::net::TcpListener::bind(("127.0.0.1", port))
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    listener
        .set_nonblocking(true)
        .map_err(|e| format!("cannot listen on 127.0.0.1:{port}: {e}"))?;
    // The bridge needs unix sockets to reach the proxy; the program gets none.
    let refused = super::seccomp::unix_sockets_refused()?;
    let mut command = std::process::Command::new(&program);
    command.args(args);
    // SAFETY: between fork and exec only the seccomp system call runs, on a program made
    // before the fork; bubblewrap already set no_new_privs.
    unsafe {
        std::os::unix::process::CommandExt::pre_exec(&mut command, move || {
            seccompiler::apply_filter(&refused).map_err(std::io::Error::other)
        });
    }
    let mut child = command
        .spawn()
        .map_err(|e| format!("cannot start {}: {e}", Path::new(&program).display()))?;
    std::thread::spawn(move || {
        let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
        else {
            return;
        };
        runtime.block_on(async move {
            let Ok(listener) = tokio::net::TcpListener::from_std(listener) else {
                return;
            };
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    // Out of descriptors, say: wait a little rather than spin.
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                    continue;
                };
                let socket = socket.clone();
                tokio::spawn(async move {
                    if let Ok(mut proxy) = tokio::net::UnixStream::connect(&socket).await {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut proxy).await;
                    }
                });
            }
        });
    });
    let status = child
        .wait()
        .map_err(|e| format!("lost the program it ran: {e}"))?;
    use std::os::unix::process::ExitStatusExt;
    Ok(status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(125))
}
