//! `kavi drill isolation` in a workspace with the shipped policies: every attack refused, each
//! with the mechanism that refused it. A machine that cannot isolate skips this (and fails
//! under CI, which installs bubblewrap).

use crate::common;

use common::{kavi, shipped_workspace};

#[test]
fn every_attack_of_the_isolation_drill_is_refused_and_says_by_what() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let out = kavi(dir.path(), &["drill", "isolation", "--json"]);
    let outcomes: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let outcomes = outcomes.as_array().unwrap();
    assert!(outcomes.len() >= 30, "{outcomes:?}");
    for outcome in outcomes {
        assert_eq!(outcome["verdict"], "refused", "{outcome}");
        assert!(
            !outcome["mechanism"].as_str().unwrap().is_empty(),
            "{outcome}"
        );
    }
    // A link in the workspace to /etc/passwd reads kavi's stand-in, never the host's file.
    let passwd = outcomes
        .iter()
        .find(|o| o["attack"] == "passwd_link")
        .unwrap();
    assert!(
        passwd["mechanism"].as_str().unwrap().contains("stand-in"),
        "{passwd}"
    );
    // A skill reaches a program by routes no scanner rule names, and its interpreter, held to
    // itself, starts none: a child that tries is killed, and so is the skill that execs itself.
    let mechanism = |attack: &str| {
        outcomes
            .iter()
            .find(|o| o["attack"] == attack)
            .unwrap_or_else(|| panic!("no {attack} case"))["mechanism"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    for attack in ["exec_ctypes", "exec_spawn", "exec_loader", "exec_memfd"] {
        assert!(
            mechanism(attack).contains("a class that starts no programs, execve killed"),
            "{attack}: {}",
            mechanism(attack)
        );
    }
    assert_eq!(mechanism("exec_self"), "seccomp: the process was killed");
    // A builder whose child makes a forbidden call, and which carries on as if nothing
    // happened, fails all the same where kavi sees every death in a tree.
    if common::every_death_or_skip() {
        assert_eq!(
            mechanism("forbidden_in_child"),
            "seccomp: a process it started was killed, which fails the run as a security \
             violation"
        );
    }
    // A bound is named only by the attack on it: each attack starts with an empty temporary
    // folder, so what `fill_disk` left there cannot stop the skill attacks after it at the disk
    // bound (which would hide whether seccomp refused `keyctl`).
    let bounds = [
        ("memory", "memory bound"),
        ("processes", "process bound"),
        ("big_file", "file size bound"),
        ("fill_disk", "disk bound"),
        ("open_files", "open files bound"),
    ];
    for outcome in outcomes {
        let attack = outcome["attack"].as_str().unwrap();
        let mechanism = outcome["mechanism"].as_str().unwrap();
        match bounds.iter().find(|(bounded, _)| *bounded == attack) {
            Some((_, bound)) => assert!(mechanism.contains(bound), "{outcome}"),
            None => assert!(!mechanism.contains("bound"), "{outcome}"),
        }
    }
    assert_eq!(out.status.code(), Some(0));
    // The drill's canaries and targets are gone with it.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with(".kavi-drill"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

/// A weakened policy shows: with the host's loopback on the list of hosts confined processes may
/// reach, a NETWORK skill's tunnel through kavi's proxy gets there, and the drill says so and
/// fails.
#[test]
fn a_weakened_profile_is_reported_allowed_and_fails_the_drill() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let policy = dir.path().join("policies/network.toml");
    let text = std::fs::read_to_string(&policy).unwrap();
    let weakened = text.replacen(
        "[processes]\nallowed_hosts = []",
        "[processes]\nallowed_hosts = [\"127.0.0.1\"]",
        1,
    );
    assert_ne!(weakened, text);
    std::fs::write(&policy, weakened).unwrap();
    let out = kavi(
        dir.path(),
        &["drill", "isolation", "--role", "skill", "--json"],
    );
    assert_eq!(
        out.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let outcomes: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let outcome = |attack: &str| {
        outcomes
            .as_array()
            .unwrap()
            .iter()
            .find(|o| o["attack"] == attack)
            .unwrap()
            .clone()
    };
    for attack in ["proxy_connect", "proxy_http"] {
        let tunnel = outcome(attack);
        assert_eq!(tunnel["verdict"], "allowed", "{tunnel}");
    }
    // Past the proxy, still nothing.
    for outcome in outcomes.as_array().unwrap() {
        if !outcome["attack"].as_str().unwrap().starts_with("proxy_") {
            assert_eq!(outcome["verdict"], "refused", "{outcome}");
        }
    }
}

/// `kavi drill gates` against the shipped policies: every attempt to talk a gate out of its
/// verdict is caught by the gate it targets, and the exit code says so.
#[test]
fn every_neutralisation_attempt_of_the_gates_drill_is_caught_by_its_gate() {
    if !common::isolation_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let out = kavi(dir.path(), &["drill", "gates", "--json"]);
    let outcomes: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let outcomes = outcomes.as_array().unwrap();
    assert!(outcomes.len() >= 30, "{outcomes:?}");
    for outcome in outcomes {
        assert_eq!(outcome["verdict"], "caught", "{outcome}");
    }
    assert_eq!(out.status.code(), Some(0));
    for (case, reason) in [
        ("os_exit_in_test", "no_report"),
        ("patched_assert_equal", "framework_replaced"),
        ("conftest_deselect", "tests_failed"),
        ("junit_rewritten", "forged_report"),
        ("hung_test", "test_timed_out"),
        ("pytestmark_skip", "tests_skipped"),
        ("item_class_runtest", "framework_replaced"),
        ("item_function_replaced", "framework_replaced"),
        ("plugin_from_test_file", "framework_replaced"),
        ("swallowed_by_context_manager", "assertion_swallowed"),
        ("swallowed_by_multiline_except", "assertion_swallowed"),
        ("swallowed_by_skill_helper", "assertion_swallowed"),
        ("swallowed_by_alias", "assertion_swallowed"),
        ("assertions_from_a_mixin", "framework_replaced"),
        ("equality_func_registered", "framework_replaced"),
    ] {
        let outcome = outcomes.iter().find(|o| o["case"] == case).unwrap();
        assert!(
            outcome["detail"]
                .as_str()
                .unwrap()
                .starts_with(&format!("tests failed: {reason}: ")),
            "{outcome}"
        );
    }
    // Issue 52's last attempts, each caught by the gate that names it (the contract run stopped
    // by its confinement is caught only as SECURITY_VIOLATION).
    for (case, caught_by) in [
        ("secret_concatenated", "secrets failed: "),
        ("secret_implicit_concatenation", "secrets failed: "),
        ("secret_joined", "secrets failed: "),
        ("secret_fstring", "secrets failed: "),
        ("secret_formatted", "secrets failed: "),
        ("secret_password_split", "secrets failed: "),
        ("secret_hex_encoded", "secrets failed: "),
        ("environment_dumped", "[environment]"),
        ("environment_copied", "[environment]"),
        ("environment_unpacked", "[environment]"),
        ("environment_items", "[environment]"),
        ("environment_named_at_run_time", "[environment]"),
        ("environment_bytes", "[environment]"),
        ("environment_by_getattr", "[environment]"),
        ("item_class_runtest_scanned", "policy failed: "),
        ("logging_file_handler", "[file_write]"),
        ("logging_rotating_handler", "[file_write]"),
        ("logging_basic_config_file", "[file_write]"),
        ("no_cover_pragma", "tests failed: branch_coverage: "),
        ("uncalled_function", "tests failed: line_coverage: "),
        ("import_path_extended", "policy failed: "),
        ("compiler_spawns", "policy failed: "),
        ("utf7_hidden_code", "[source]"),
        ("fullwidth_no_type_check", "[source]"),
        (
            "contract_tripwire",
            "contract failed: running its examples, the skill was stopped by its confinement",
        ),
        (
            "contract_no_examples",
            "contract failed: too_few_examples: ",
        ),
    ] {
        let outcome = outcomes.iter().find(|o| o["case"] == case).unwrap();
        assert!(
            outcome["detail"].as_str().unwrap().contains(caught_by),
            "{outcome}"
        );
    }
    // Both gates catch the forged reports: the scan by `timeit`, the test gate by its witness.
    let timeit = outcomes
        .iter()
        .find(|o| o["case"] == "timeit_patches_reports")
        .unwrap();
    assert!(
        timeit["detail"]
            .as_str()
            .unwrap()
            .contains("tests failed: framework_replaced: "),
        "{timeit}"
    );
}

/// An account other than root may make no cgroup on a machine like CI's (its cgroup v1
/// hierarchies are root's), so no cgroup bounds its sandboxes' processes: kavi sets the bound
/// as `RLIMIT_NPROC` on the sandbox's init before the program starts, which the kernel counts
/// in the sandbox's own user namespace. A skill that starts 500 processes stops at its bound,
/// and every other attack is refused as it is for root.
#[test]
fn another_accounts_sandboxes_are_held_to_their_processes_bound() {
    if !common::isolation_or_skip() || !common::other_accounts_or_skip() {
        return;
    }
    let dir = shipped_workspace();
    let cache = dir.path().join(".cache");
    std::fs::create_dir(&cache).unwrap();
    common::open_to_other_accounts(dir.path());
    let out = common::as_account(
        4303,
        dir.path(),
        &["drill", "isolation", "--role", "skill", "--json"],
    )
    // The tests' shared cache home is root's.
    .env("XDG_CACHE_HOME", &cache)
    .output()
    .unwrap();
    let outcomes: serde_json::Value = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
    let outcomes = outcomes.as_array().unwrap();
    let processes = outcomes
        .iter()
        .find(|o| o["attack"] == "processes")
        .unwrap();
    assert_eq!(processes["verdict"], "refused", "{processes}");
    assert!(
        processes["mechanism"]
            .as_str()
            .unwrap()
            .contains("process bound"),
        "{processes}"
    );
    for outcome in outcomes {
        assert_eq!(outcome["verdict"], "refused", "{outcome}");
    }
    assert_eq!(out.status.code(), Some(0));
}
