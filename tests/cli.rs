//! CLI scenarios pinned with trycmd: `tests/cmd/*.toml` (one command each) and `tests/cmd/*.md`
//! (stories). Refresh expected output with `TRYCMD=overwrite cargo test --test cli`, then read
//! the diff before committing it.

#[test]
fn cli_scenarios() {
    trycmd::TestCases::new()
        .case("tests/cmd/*.toml")
        .case("tests/cmd/*.md");
}
