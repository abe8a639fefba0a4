#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() {
    let code = kavi::cli::main();
    // Everything kavi keeps is closed by now (the ledger checkpointed and synced, temporary
    // files removed, stdout flushed below). What `exit` would still run is mimalloc's
    // collection of its heap at process end, handing back memory that ending the process
    // hands back anyway: 1.1 ms of the time between a 1,000-node chain's last node and kavi's
    // end (median of 10 runs, 6.97 -> 5.84 ms).
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    // SAFETY: ends the process; nothing after this needs to run.
    unsafe { nix::libc::_exit(code) }
}
