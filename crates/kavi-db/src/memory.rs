//! SQLite's memory, from mimalloc.
//!
//! SQLite allocates through the C library's `malloc` unless told otherwise, and glibc gives
//! every thread that allocates its own arena: the thread that opens the ledger and the
//! recorder's each mapped a 64 MB arena and grew it page by page, about a third of the opening
//! thread's time on a 10-node pipeline (perf, 30 runs). Through mimalloc, SQLite's pages come
//! from the heap the rest of kavi already uses.
//!
//! SQLite also keeps no statistics of its memory: with them on, every allocation and every
//! free takes a process-wide mutex and asks the block's size twice, about 14% of the CPU of
//! creating a ledger (perf, 60 runs of a one-node pipeline). kavi never reads them.

use std::os::raw::{c_int, c_void};
use std::sync::Once;

use libmimalloc_sys as mi;
use rusqlite::ffi;

/// Hands SQLite mimalloc's functions, once, before the first connection. SQLite takes them only
/// before it initialises: where a connection was opened first (outside the ledger), it keeps
/// its own, which is as correct, and this is a no-op.
pub fn use_mimalloc() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let methods = ffi::sqlite3_mem_methods {
            xMalloc: Some(malloc),
            xFree: Some(free),
            xRealloc: Some(realloc),
            xSize: Some(size),
            xRoundup: Some(roundup),
            xInit: Some(init),
            xShutdown: Some(shutdown),
            pAppData: std::ptr::null_mut(),
        };
        // SAFETY: SQLite copies the methods; each function below keeps its contract (memory at
        // least 8-byte aligned, `size` of what `malloc` or `realloc` returned).
        let status = unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MALLOC, &raw const methods) };
        if status != ffi::SQLITE_OK {
            tracing::debug!(
                status,
                "SQLite keeps its own allocator: it was initialised first"
            );
        }
        // SAFETY: an integer argument, as SQLITE_CONFIG_MEMSTATUS takes; refused, like the
        // allocator, only once SQLite is initialised, and then harmless.
        unsafe { ffi::sqlite3_config(ffi::SQLITE_CONFIG_MEMSTATUS, c_int::from(false)) };
    });
}

unsafe extern "C" fn malloc(bytes: c_int) -> *mut c_void {
    // SAFETY: mimalloc's malloc takes any size; its blocks are 16-byte aligned.
    unsafe { mi::mi_malloc(usize::try_from(bytes).unwrap_or(0)) }
}

unsafe extern "C" fn free(block: *mut c_void) {
    // SAFETY: SQLite frees only what `malloc` or `realloc` gave it.
    unsafe { mi::mi_free(block) }
}

unsafe extern "C" fn realloc(block: *mut c_void, bytes: c_int) -> *mut c_void {
    // SAFETY: as `free`, and mimalloc's realloc keeps the block's alignment.
    unsafe { mi::mi_realloc(block, usize::try_from(bytes).unwrap_or(0)) }
}

unsafe extern "C" fn size(block: *mut c_void) -> c_int {
    // SAFETY: `block` came from `malloc` or `realloc`.
    let usable = unsafe { mi::mi_usable_size(block) };
    c_int::try_from(usable).unwrap_or(c_int::MAX)
}

unsafe extern "C" fn roundup(bytes: c_int) -> c_int {
    // SAFETY: a pure function of the size.
    let good = unsafe { mi::mi_good_size(usize::try_from(bytes).unwrap_or(0)) };
    c_int::try_from(good).unwrap_or(bytes)
}

unsafe extern "C" fn init(_: *mut c_void) -> c_int {
    ffi::SQLITE_OK
}

unsafe extern "C" fn shutdown(_: *mut c_void) {}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `no_thp` feature of libmimalloc-sys (Cargo.toml says why): no mapping of this
    /// process is marked for huge pages (`hg` in smaps' VmFlags), though mimalloc has just
    /// reserved and touched memory of its own, and the process does not turn huge pages off for
    /// the programs it starts.
    #[test]
    fn mimalloc_asks_for_no_huge_pages_and_leaves_them_to_children() {
        const BLOCK: usize = 8 << 20;
        // SAFETY: a block written and freed again.
        unsafe {
            let block = mi::mi_malloc(BLOCK).cast::<u8>();
            assert!(!block.is_null());
            block.write_bytes(1, BLOCK);
            assert!(mi::mi_is_in_heap_region(block.cast()));
            let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
            mi::mi_free(block.cast());
            let marked: Vec<&str> = smaps
                .lines()
                .filter(|line| line.starts_with("VmFlags:"))
                .filter(|line| line.split_whitespace().any(|flag| flag == "hg"))
                .collect();
            assert!(
                marked.is_empty(),
                "mappings marked for huge pages: {marked:?}"
            );
        }
        // SAFETY: a query with no pointer arguments.
        let disabled = unsafe { nix::libc::prctl(nix::libc::PR_GET_THP_DISABLE, 0, 0, 0, 0) };
        assert_eq!(
            disabled, 0,
            "huge pages turned off for this process and its children"
        );
    }
}
