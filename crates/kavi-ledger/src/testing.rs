//! Fixtures for the tests of this crate and of the crates above it. Always built, not behind a
//! feature: a feature only tests turn on makes `cargo build` and `cargo test` build the ledger
//! and everything above it twice over, each undoing the other.

use std::path::Path;

use serde_json::Value;

use crate::{Ledger, NewRun, Owner, RunOrigin};

/// The demo pipeline's text, and its spec hash.
pub const DEMO_TEXT: &str = "[pipeline]\nname = \"demo\"\n";
pub static DEMO_HASH: std::sync::LazyLock<String> =
    std::sync::LazyLock::new(|| kavi_foundation::hash::spec_hash(DEMO_TEXT));

/// Keeps the keys of every ledger this process opens from now on apart from the account's own
/// (see [`crate::keys::dir`]): a unit test that opens a ledger calls this first, as
/// [`fresh_ledger`] does.
pub fn isolate_keys() {
    crate::keys::use_unit_test_keys();
}

/// A new ledger in a temporary folder, and an owner of it.
pub fn fresh_ledger() -> (tempfile::TempDir, Ledger, Owner) {
    isolate_keys();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ledger.db");
    let ledger = Ledger::open(&path).unwrap();
    let owner = Owner::claim(&path, dir.path()).unwrap();
    (dir, ledger, owner)
}

/// A run of the demo pipeline, with `params` and exec nodes `nodes`, no governing set.
pub fn new_run(params: &Value, nodes: &[&str], owner: &Owner) -> NewRun {
    NewRun {
        owner: owner.name().to_owned(),
        pipeline: "demo".into(),
        spec_path: "pipelines/demo.toml".into(),
        spec_hash: DEMO_HASH.clone(),
        spec_text: DEMO_TEXT.into(),
        params: params.clone(),
        origin: RunOrigin::User,
        nodes: nodes
            .iter()
            .map(|node| ((*node).to_owned(), "exec"))
            .collect(),
        governing: Vec::new(),
        allowed_changes: None,
        local_settings: None,
    }
}

/// How many frames the WAL holds, and how many of them are in the file: the WAL index's
/// `mxFrame` and `nBackfill`, read from the `-shm` file (native byte order).
pub fn wal_frames(path: &Path) -> (u32, u32) {
    let shm = std::fs::read(format!("{}-shm", path.display())).unwrap();
    let word = |at: usize| u32::from_ne_bytes(shm[at..at + 4].try_into().unwrap());
    (word(16), word(96))
}
