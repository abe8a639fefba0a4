//! CLI scenarios pinned with trycmd: `tests/cmd/*.toml` (one command each) and `tests/cmd/*.md`
//! (stories). Refresh expected output with `TRYCMD=overwrite cargo test --test cli`, then read
//! the diff (and restore the `[..]` redactions) before committing it.

mod common;

use std::path::Path;

/// The forge story runs against the shipped workspace itself, copied fresh into its fixture
/// folder, so the scenario always exercises what ships (the folder is git-ignored).
fn prepare_forge_fixture() {
    let fixture = common::repo().join("tests/cmd/forge.in");
    let _ = std::fs::remove_dir_all(&fixture);
    common::copy_shipped_workspace(&fixture);
}

#[test]
fn cli_scenarios() {
    prepare_forge_fixture();
    // Stories change files between steps with `sh`, as a user would with an editor.
    trycmd::TestCases::new()
        .register_bin("sh", Path::new("/bin/sh"))
        .case("tests/cmd/*.toml")
        .case("tests/cmd/*.md");
}
