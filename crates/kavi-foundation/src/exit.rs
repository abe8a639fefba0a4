//! The exit codes kavi documents (docs/exit-codes.md): every command's, and the one an exported
//! workflow's retry strategy retries on.

/// Everything asked for succeeded.
pub const SUCCESS: i32 = 0;
/// A run finished, and failed: a node failed, timed out or was blocked.
pub const RUN_FAILED: i32 = 1;
/// The command line was wrong (unknown flag, bad `--set`, ...).
pub const USAGE: i32 = 2;
/// A spec is invalid: malformed TOML, unknown field, cycle, missing parameter, ...
pub const INVALID_SPEC: i32 = 3;
/// The workspace could not be used: configuration, ledger, or file system.
pub const ENVIRONMENT: i32 = 4;
/// A run or record named on the command line does not exist.
pub const NOT_FOUND: i32 = 5;
/// The run stopped for a person's decision (`kavi approve` / `kavi reject`).
pub const AWAITING_REVIEW: i32 = 6;
/// `kavi pipeline step`: the node's retry policy wants another attempt (`EX_TEMPFAIL`, what
/// an exported workflow's retry strategy retries on).
pub const RETRY: i32 = 75;
/// The run was cancelled (Ctrl-C); 128 + SIGINT, as shells report it. SIGTERM and SIGHUP
/// cancel the same way and exit 128 + their number (see `cli::cancelled_exit_code`).
pub const CANCELLED: i32 = 130;
