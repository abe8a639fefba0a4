//! Tests of skill proposals, write scopes, commands and the lifecycle policy.

use super::*;
use crate::diagnostic::SourceFile;
use crate::roles::{Requirement, Roles};

#[test]
fn a_command_runs_only_a_file_of_the_skill_folder() {
    let refused = |argv: &[&str]| {
        let argv: Vec<String> = argv.iter().map(|a| (*a).to_owned()).collect();
        untrusted_program(&argv, "skills/demo")
    };
    for fine in [
        &["python3", "skills/demo/skill.py"][..],
        &[
            "python3.11",
            "-u",
            "-O",
            "skills/demo/skill.py",
            "-X",
            "whatever",
        ],
        &["skills/demo/skill.py"],
        &["python3"],
    ] {
        assert_eq!(refused(fine), None, "{fine:?}");
    }
    for (bad, says) in [
        (
            &[
                "python3",
                "-X",
                "pycache_prefix=pyc",
                "skills/demo/skill.py",
            ][..],
            "`-X`",
        ),
        (&["python3", "-c", "print(1)"], "`-c`"),
        (&["python3", "-uX", "skills/demo/skill.py"], "`-uX`"),
        (
            &["python3", "helpers/x.py"],
            "`helpers/x.py` is not a script",
        ),
        (
            &["env", "LD_PRELOAD=x.so", "python3", "skills/demo/skill.py"],
            "`env`",
        ),
        (&["sh", "skills/demo/run.sh"], "`sh`"),
        // Python the policy scan would read as text.
        (
            &["python3", "skills/demo/README.md"],
            "`skills/demo/README.md` is not a `.py` file",
        ),
        (&["skills/demo/README.md"], "not a `.py` file"),
        (&["skills/demo/run"], "not a `.py` file"),
        (&["python3-config"], "`python3-config`"),
    ] {
        let reason = refused(bad).unwrap_or_else(|| panic!("{bad:?} was allowed"));
        assert!(reason.contains(says), "{bad:?}: {reason}");
    }
}

#[test]
fn names_that_could_be_paths_are_refused() {
    assert_eq!(invalid_name_reason("write_note"), None);
    for bad in [
        "../x",
        "a/b",
        "Note",
        "",
        "1abc",
        "a-b",
        "a.b",
        &"a".repeat(65),
    ] {
        assert!(invalid_name_reason(bad).is_some(), "{bad} was accepted");
    }
}

#[test]
fn a_kept_version_runs_its_own_files_and_nothing_else_is_rewritten() {
    let text = r#"
name = "demo"
description = "d"
side_effect = "READ_ONLY"
command = ["python3", "-u", "skills/demo/run.py", "--config=skills/demo/c.json", "--mode=fast", "skills/demo2/x"]
input_schema = { type = "object" }
output_schema = { type = "object" }
"#;
    let proposal = Proposal::parse(&SourceFile::new("proposals/demo.toml", text)).unwrap();
    let base = std::path::Path::new("/tmp/kept");
    assert_eq!(
        proposal.command_under("skills/demo", base),
        [
            "python3",
            "-u",
            "/tmp/kept/skills/demo/run.py",
            "--config=/tmp/kept/skills/demo/c.json",
            "--mode=fast",
            "skills/demo2/x",
        ]
    );
}

#[test]
fn terminal_states_are_not_dead_ends_and_drift_needs_its_transition() {
    let lifecycle = |text: &str| {
        Lifecycle::parse_declared(&SourceFile::new("policies/lifecycle.toml", text)).unwrap()
    };
    let base = "initial = \"P\"\nstates = [\"P\", \"TRUSTED\", \"GONE\", \"S\"]\nbuildable = [\"P\"]\n\
                    drifted = \"S\"\n[[transition]]\nfrom = \"P\"\nto = \"TRUSTED\"\n\
                    [[transition]]\nfrom = \"TRUSTED\"\nto = \"GONE\"\n";
    let found: Vec<String> = lifecycle(base)
        .problems()
        .iter()
        .map(|d| d.message.clone())
        .collect();
    assert_eq!(
        found,
        [
            "`GONE` is a dead end: no chain of transitions leads from it to TRUSTED",
            "`S` is unreachable: no chain of transitions leads to it from `initial` (P)",
            "`S` is a dead end: no chain of transitions leads from it to TRUSTED",
            "no transition TRUSTED -> S is declared: `kavi skill verify` (on drift) makes that move",
            "no transition S -> TRUSTED is declared: `kavi skill restore` makes that move",
        ]
    );
    let fixed = format!(
        "terminal = [\"GONE\"]\n{base}[[transition]]\nfrom = \"TRUSTED\"\nto = \"S\"\n\
             [[transition]]\nfrom = \"S\"\nto = \"TRUSTED\"\n"
    );
    assert!(lifecycle(&fixed).problems().is_empty());
}

/// Each lifecycle issue 53 found the forge could not carry out, refused with its reason.
#[test]
fn a_lifecycle_kavi_cannot_carry_out_is_refused_with_the_reason() {
    let shipped = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../policies/lifecycle.toml"
    ))
    .unwrap();
    let roles = Roles::parse(&SourceFile::new(
        crate::roles::DEFAULT_POLICY,
        "[role.reviewer]\nmembers = [\"*\"]\n[role.pair]\nmembers = [\"alice\"]\n",
    ))
    .unwrap();
    let problems = |text: &str| -> Vec<String> {
        match Lifecycle::parse_declared(&SourceFile::new("policies/lifecycle.toml", text)) {
            Ok(lifecycle) => [lifecycle.problems(), lifecycle.role_problems(Some(&roles))]
                .concat()
                .iter()
                .map(|d| d.message.clone())
                .collect(),
            Err(refused) => vec![refused.message],
        }
    };
    assert!(problems(&shipped).is_empty(), "{:?}", problems(&shipped));
    let gated = |from: &str, to: &str, approval: &str| {
        let block = format!("from = \"{from}\"\nto = \"{to}\"\n");
        assert!(shipped.contains(&block), "{block}");
        shipped.replacen(&block, &format!("{block}approval = {approval}\n"), 1)
    };
    for (text, reason) in [
        (
            gated("TRUSTED", "REVOKED", "true"),
            "the transition TRUSTED -> REVOKED needs a recorded approval, but `kavi skill \
                 revoke` makes it without stopping for one: it could never happen",
        ),
        (
            gated(
                "SUSPENDED",
                "TRUSTED",
                "{ role = \"reviewer\", approvals = 2 }",
            ),
            "the transition SUSPENDED -> TRUSTED needs 2 approvals by distinct accounts \
                 holding `reviewer` other than the run's starter, but `kavi skill restore` makes \
                 it without stopping for one: it could never happen",
        ),
        (
            gated("VERIFIED", "REJECTED", "true"),
            "the transition VERIFIED -> REJECTED needs a recorded approval, but `kavi reject` \
                 makes it without stopping for one: it could never happen",
        ),
        (
            gated(
                "VERIFIED",
                "TRUSTED",
                "{ role = \"auditor\", approvals = 1 }",
            ),
            "role `auditor` is not declared in policies/roles.toml: known: `pair`, `reviewer`",
        ),
        (
            gated("VERIFIED", "TRUSTED", "{ role = \"pair\", approvals = 2 }"),
            "no one can give the approval VERIFIED -> TRUSTED needs: role `pair` has 1 named \
                 members, fewer than the 2 approvals needed",
        ),
        (
            gated(
                "VERIFIED",
                "TRUSTED",
                "{ role = \"reviewer\", approvals = 0 }",
            ),
            "`approvals` counts distinct approvers and must be at least 1",
        ),
        (
            shipped.replace(
                "terminal = [\"REVOKED\", \"REJECTED\"]",
                "terminal = [\"REVOKED\", \"REJECTED\", \"BUILT\"]",
            ),
            "`BUILT` is both buildable and terminal: a build would overwrite a skill that is \
                 meant to stay BUILT for good",
        ),
        (
            shipped.replace(
                "\"REJECTED\"]\n# A build",
                "\"REJECTED\", \"LOST\"]\n# A build",
            ) + "[[transition]]\nfrom = \"LOST\"\nto = \"PROPOSED\"\n",
            "`LOST` is unreachable: no chain of transitions leads to it from `initial` \
                 (PROPOSED)",
        ),
        (
            shipped.replace(
                "[[transition]]\nfrom = \"VERIFIED\"\nto = \"REJECTED\"\n\
                     description = \"a person rejected the run that was building it\"\n",
                "",
            ),
            "no transition VERIFIED -> REJECTED is declared: `kavi reject` makes that move",
        ),
    ] {
        let found = problems(&text);
        assert!(
            found.iter().any(|p| p == reason),
            "{reason}\nnot in {found:?}"
        );
    }
}

/// A promotion walks through the states between the verified one and TRUSTED, never back
/// through a buildable one.
#[test]
fn the_way_to_trusted_passes_a_review_state_and_says_what_each_move_needs() {
    let text = "initial = \"P\"\nstates = [\"P\", \"V\", \"R\", \"TRUSTED\"]\n\
                    buildable = [\"P\"]\n\
                    [[transition]]\nfrom = \"P\"\nto = \"V\"\n\
                    [[transition]]\nfrom = \"V\"\nto = \"P\"\n\
                    [[transition]]\nfrom = \"V\"\nto = \"R\"\n\
                    approval = { role = \"reviewer\", approvals = 2 }\n\
                    [[transition]]\nfrom = \"R\"\nto = \"TRUSTED\"\n\
                    [[transition]]\nfrom = \"TRUSTED\"\nto = \"P\"\n";
    let lifecycle = Lifecycle::parse(&SourceFile::new("policies/lifecycle.toml", text)).unwrap();
    let two = Approval::Roles(Requirement {
        role: "reviewer".to_owned(),
        approvals: 2,
    });
    assert_eq!(
        lifecycle.toward_trusted("V"),
        Some(("R".to_owned(), Some(two)))
    );
    assert_eq!(
        lifecycle.toward_trusted("R"),
        Some((TRUSTED.to_owned(), None))
    );
    assert_eq!(lifecycle.toward_trusted(TRUSTED), None);
    // P -> V is the gates' move, never a promotion's.
    assert_eq!(lifecycle.toward_trusted("P"), None);
    assert_eq!(
        lifecycle.check("V", "R").unwrap_err(),
        "the transition V -> R needs 2 approvals by distinct accounts holding `reviewer` \
             other than the run's starter (policies/lifecycle.toml)"
    );
}

#[test]
fn the_lifecycle_allows_only_declared_transitions_and_says_what_is_allowed() {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../policies/lifecycle.toml"
    ))
    .unwrap();
    let lifecycle = Lifecycle::parse(&SourceFile::new("policies/lifecycle.toml", text)).unwrap();
    assert_eq!(lifecycle.initial, "PROPOSED");
    assert!(lifecycle.check("PROPOSED", "BUILT").is_ok());
    assert_eq!(
        lifecycle.check("PROPOSED", "TRUSTED").unwrap_err(),
        "the transition PROPOSED -> TRUSTED is not allowed by policies/lifecycle.toml (from PROPOSED it allows: BUILT, REJECTED)"
    );
}

#[test]
fn a_lifecycle_naming_an_undeclared_state_points_at_it() {
    let source = SourceFile::new(
        "l.toml",
        "initial = \"NEW\"\nstates = [\"NEW\"]\nbuildable = [\"NEW\"]\n[[transition]]\nfrom = \"NEW\"\nto = \"DONE\"\n",
    );
    let err = Lifecycle::parse(&source).unwrap_err();
    assert_eq!(err.message, "`DONE` is not one of the declared states");
    assert_eq!(err.position().as_deref(), Some("l.toml:6:6"));
}
