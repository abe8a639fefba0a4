//! CLI scenarios pinned with trycmd: `tests/cmd/*.toml` (one command each) and `tests/cmd/*.md`
//! (stories). Refresh expected output with `TRYCMD=overwrite cargo test --test cli`, then read
//! the diff (and restore the `[..]` redactions) before committing it.

use std::path::Path;

/// The forge story runs against the shipped workspace itself, copied fresh into its fixture
/// folder, so the scenario always exercises what ships (the folder is git-ignored).
fn prepare_forge_fixture() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let fixture = repo.join("tests/cmd/forge.in");
    let _ = std::fs::remove_dir_all(&fixture);
    for folder in [
        "pipelines",
        "policies",
        "templates",
        "proposals",
        "builders",
    ] {
        copy_dir(&repo.join(folder), &fixture.join(folder));
    }
    std::fs::copy(repo.join("kavi.toml"), fixture.join("kavi.toml")).unwrap();
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() == "__pycache__" {
            continue;
        }
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &to.join(entry.file_name()));
        } else {
            std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
        }
    }
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
