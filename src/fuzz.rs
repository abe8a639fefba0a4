//! Property tests: no spec file can make kavi panic.
//!
//! Each case takes one of the shipped files (`kavi.toml`, pipelines, policies, chains,
//! proposals), damages it (an extreme value in place of a value, a line dropped or repeated, the
//! text cut short, stray characters) and loads the whole workspace as `kavi pipeline check`,
//! `kavi chain check` and `kavi skill propose` would. A loader may refuse the file, and must say
//! why; it may never panic. The damaged file must also read the same through the one-pass
//! reader of pipelines as through toml (`spec::document`).
//!
//! The default is 64 cases a run. For a longer campaign:
//! `PROPTEST_CASES=20000 cargo test --lib fuzz`; a failure prints the smallest damaged file
//! proptest could shrink it to.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use proptest::prelude::*;

use crate::config::{Overrides, Workspace};
use crate::diagnostic::SourceFile;
use crate::spec::LoadContext;
use crate::template::TemplateEngine;

/// The shipped files a workspace is made of, relative to the repository.
const SEEDS: &[&str] = &[
    "kavi.toml",
    "pipelines/diamond.toml",
    "pipelines/forge.toml",
    "pipelines/forge_attempt.toml",
    "pipelines/import.toml",
    "policies/allowlist.toml",
    "policies/classifier.toml",
    "policies/confinement.toml",
    "policies/conventions.toml",
    "policies/escalation.toml",
    "policies/gates.toml",
    "policies/invariants.toml",
    "policies/lifecycle.toml",
    "policies/network.toml",
    "policies/roles.toml",
    "policies/sandbox.toml",
    "policies/scanner.toml",
    "policies/toolchains.toml",
    "policies/trust.toml",
    "chains/search_and_summarize.toml",
    "proposals/find_notes.toml",
    "proposals/summarize_note.toml",
    "proposals/word_count.toml",
    "proposals/write_note.toml",
];

/// Values at the edges of what each field could hold: durations, counts and sizes at their
/// limits and past them, empty and huge strings, paths that lead out, broken templates.
const EXTREMES: &[&str] = &[
    "\"\"",
    "0",
    "-1",
    "18446744073709551615",
    "9223372036854775807",
    "-9223372036854775808",
    "1e308",
    "nan",
    "inf",
    "\"0s\"",
    "\"18446744073709551615s\"",
    "\"99999999999999999999d\"",
    "\"1ns\"",
    "\"-5s\"",
    "\"..\"",
    "\"../../../etc/passwd\"",
    "\"/\"",
    "\"{{\"",
    "\"{{ nodes.x.outputs[ }}\"",
    "\"{% for %}\"",
    "\"$.[\"",
    "[]",
    "[\"\"]",
    "{}",
    "true",
    "\"\\u0000\"",
    "\"é\u{202e}\u{1F600}\"",
    "1970-01-01T00:00:00Z",
    "[[1], [\"a\"]]",
    "{ a = { b = { c = { d = 1 } } } }",
];

/// One way of damaging a file.
#[derive(Debug, Clone)]
enum Damage {
    /// The value on a line (after ` = `) becomes one of [`EXTREMES`].
    Extreme { line: usize, value: usize },
    /// A line is left out.
    Drop { line: usize },
    /// A line appears twice.
    Repeat { line: usize },
    /// The text stops early.
    Cut { at: usize },
    /// Characters are inserted.
    Insert { at: usize, text: String },
    /// A value becomes a very long string.
    Long { line: usize, length: usize },
}

fn damage() -> impl Strategy<Value = Damage> {
    prop_oneof![
        4 => (any::<usize>(), 0..EXTREMES.len())
            .prop_map(|(line, value)| Damage::Extreme { line, value }),
        1 => any::<usize>().prop_map(|line| Damage::Drop { line }),
        1 => any::<usize>().prop_map(|line| Damage::Repeat { line }),
        1 => any::<usize>().prop_map(|at| Damage::Cut { at }),
        1 => (any::<usize>(), "\\PC{0,8}").prop_map(|(at, text)| Damage::Insert { at, text }),
        1 => (any::<usize>(), 1000..200_000usize)
            .prop_map(|(line, length)| Damage::Long { line, length }),
    ]
}

impl Damage {
    fn apply(&self, text: &str) -> String {
        let mut lines: Vec<String> = text.lines().map(str::to_owned).collect();
        let count = lines.len().max(1);
        let char_at = |at: usize| {
            let boundaries: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
            boundaries
                .get(at % boundaries.len().max(1))
                .copied()
                .unwrap_or(0)
        };
        let set_value = |lines: &mut Vec<String>, line: usize, value: &str| {
            if let Some(target) = lines.get_mut(line % count)
                && let Some((key, _)) = target.split_once(" = ")
            {
                *target = format!("{key} = {value}");
            }
        };
        match self {
            Damage::Extreme { line, value } => set_value(&mut lines, *line, EXTREMES[*value]),
            Damage::Long { line, length } => {
                set_value(&mut lines, *line, &format!("\"{}\"", "x".repeat(*length)));
            }
            Damage::Drop { line } if !lines.is_empty() => {
                lines.remove(line % count);
            }
            Damage::Repeat { line } if !lines.is_empty() => {
                let repeated = lines[line % count].clone();
                lines.insert(line % count, repeated);
            }
            Damage::Cut { at } => return text[..char_at(*at)].to_owned(),
            Damage::Insert { at, text: inserted } => {
                let at = char_at(*at);
                return format!("{}{inserted}{}", &text[..at], &text[at..]);
            }
            Damage::Drop { .. } | Damage::Repeat { .. } => {}
        }
        lines.join("\n")
    }
}

/// Loads everything a workspace declares; returns the errors, rendered as a user would see them.
fn load_everything(root: &Path) -> Vec<String> {
    let mut errors = Vec::new();
    if let Err(e) = Workspace::load(Some(root), &Overrides::default()) {
        errors.push(e.to_string());
    }
    let templates = TemplateEngine::new(&root.join("templates"));
    let context = LoadContext {
        root,
        templates: &templates,
        including: &[],
        registry: crate::nodes::registry(),
    };
    for seed in SEEDS {
        let path = root.join(seed);
        let display = PathBuf::from(seed);
        let loaded = if seed.starts_with("pipelines/") {
            crate::spec::load_pipeline(&path, &display, &context).map(drop)
        } else if seed.starts_with("chains/") {
            crate::chains::load(&path, &display, &templates).map(drop)
        } else if seed.starts_with("proposals/") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            crate::skills::Proposal::parse(&SourceFile::new(display, text))
                .map(drop)
                .map_err(Into::into)
        } else if *seed == crate::policy::roles::DEFAULT_POLICY {
            crate::policy::roles::Roles::load(root)
                .map(drop)
                .map_err(Into::into)
        } else if *seed == "policies/confinement.toml" {
            crate::policy::read(root, seed)
                .map_err(|message| crate::diagnostic::Diagnostic::new(message).into())
                .and_then(|source| {
                    crate::confinement::policy::ConfinementPolicy::parse(&source, &templates)
                        .map(drop)
                        .map_err(Into::into)
                })
        } else {
            // kavi.toml is loaded above, and the other policies by the pipelines that use them.
            Ok(())
        };
        if let Err(e) = loaded {
            errors.push(e.to_string());
        }
    }
    errors
}

/// A copy of the shipped files in a fresh folder.
fn shipped_workspace() -> tempfile::TempDir {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = tempfile::tempdir().expect("a temporary folder");
    for folder in ["templates", "builders"] {
        copy_folder(&repo.join(folder), &dir.path().join(folder));
    }
    for seed in SEEDS {
        let to = dir.path().join(seed);
        std::fs::create_dir_all(to.parent().expect("seeds are in folders or the root"))
            .expect("a folder");
        std::fs::copy(repo.join(seed), to).expect("a shipped file");
    }
    dir
}

fn copy_folder(from: &Path, to: &Path) {
    for entry in walkdir::WalkDir::new(from) {
        let entry = entry.expect("a readable shipped file");
        let target = to.join(entry.path().strip_prefix(from).expect("inside"));
        if entry.file_type().is_dir() {
            std::fs::create_dir_all(&target).expect("a folder");
        } else if entry.file_type().is_file() {
            std::fs::copy(entry.path(), &target).expect("a copy");
        }
    }
}

/// The harness is only worth its runs if the untouched files load and every file it damages is
/// read by some loader: a file nobody loads could never make anything panic.
#[test]
fn the_shipped_files_load_and_each_one_is_read_by_a_loader() {
    let dir = shipped_workspace();
    assert_eq!(load_everything(dir.path()), Vec::<String>::new());
    for seed in SEEDS {
        let path = dir.path().join(seed);
        let original = std::fs::read_to_string(&path).unwrap();
        std::fs::write(&path, "[broken").unwrap();
        let errors = load_everything(dir.path());
        std::fs::write(&path, original).unwrap();
        assert!(!errors.is_empty(), "nothing reads {seed}");
        assert!(
            errors.iter().any(|e| e.contains(seed)),
            "the error does not name {seed}: {errors:?}"
        );
    }
}

/// Cases a run: a case loads the whole workspace (about 80 ms in a debug build), so the default
/// suite runs fewer than proptest's usual 256; `PROPTEST_CASES` asks for more.
fn cases() -> u32 {
    std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|cases| cases.parse().ok())
        .unwrap_or(64)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn no_damaged_spec_file_makes_a_loader_panic(
        seed in 0..SEEDS.len(),
        damages in prop::collection::vec(damage(), 1..4),
    ) {
        thread_local! {
            static WORKSPACE: tempfile::TempDir = shipped_workspace();
        }
        WORKSPACE.with(|dir| {
            let path = dir.path().join(SEEDS[seed]);
            let original = std::fs::read_to_string(&path).unwrap();
            let damaged = damages.iter().fold(original.clone(), |text, d| d.apply(&text));
            std::fs::write(&path, &damaged).unwrap();
            let outcome = catch_unwind(AssertUnwindSafe(|| load_everything(dir.path())));
            std::fs::write(&path, &original).unwrap();
            prop_assert!(
                outcome.is_ok(),
                "a loader panicked on this {}:\n{damaged}",
                SEEDS[seed]
            );
            // Pipelines are read in one pass where they can be: damaged, every file must
            // still read exactly as toml reads it, or be left to toml.
            let agreed = crate::spec::agrees_with_toml(&damaged);
            prop_assert!(agreed.is_ok(), "{agreed:?} on this {}:\n{damaged}", SEEDS[seed]);
            Ok(())
        })?;
    }
}
