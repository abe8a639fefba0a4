//! The advisory end to end: the shipped forge asks an LLM gateway for a revised packet after a
//! failed attempt. No real gateway can exist here, so a stand-in plays it: a real HTTP server on
//! a loopback port, answering the OpenAI chat-completions wire format. Nothing else is faked: the
//! forge, the builder, the gates and the ledger are the real ones.

use crate::common;

use common::stand_in::StandIn;
use common::{json, kavi_command, node, shipped_workspace};

use std::net::TcpListener;
use std::path::Path;
use std::process::Output;

use serde_json::{Value, json};

/// A chat-completions answer carrying `content`.
fn completion(content: &str) -> Value {
    json!({
        "id": "chatcmpl-standin",
        "object": "chat.completion",
        "model": "stand-in",
        "choices": [{
            "index": 0,
            "message": { "role": "assistant", "content": content },
            "finish_reason": "stop",
        }],
    })
}

/// The packet quoted at the end of an advisory prompt.
fn packet_in(prompt: &str) -> &str {
    let marker = "(attempt 1):\n\n";
    &prompt[prompt.find(marker).unwrap() + marker.len()..]
}

const API_KEY: &str = "sk-standin-do-not-log-0123456789";

/// `kavi` with the gateway configured through the environment, as a user would.
fn kavi_with_gateway(root: &Path, base_url: &str, extra: &[(&str, &str)], args: &[&str]) -> Output {
    let mut command = kavi_command(root, args);
    command
        .env("KAVI_GATEWAY_BASE_URL", base_url)
        .env("KAVI_GATEWAY_MODEL", "stand-in-model")
        .env("KAVI_GATEWAY_TIMEOUT", "5s")
        .env("KAVI_GATEWAY_API_KEY", API_KEY);
    for (key, value) in extra {
        command.env(key, value);
    }
    command.output().unwrap()
}

/// The forge's arguments for `word_count`, with the scripted builder's `flaws`.
fn forge_args(flaws: &str) -> Vec<String> {
    let flaws = format!("flaws={flaws}");
    [
        "pipeline",
        "run",
        "forge",
        "--set",
        "skill=word_count",
        "--set",
        &flaws,
    ]
    .map(String::from)
    .to_vec()
}

fn forge(root: &Path, base_url: &str, extra: &[(&str, &str)], flaws: &str) -> Output {
    let args = forge_args(flaws);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    kavi_with_gateway(root, base_url, extra, &args)
}

/// The newest forge run's attempts, each as `kavi runs show --json`.
fn attempts(root: &Path) -> Vec<Value> {
    let run = json(
        &kavi_command(root, &["runs", "show", "--json"])
            .output()
            .unwrap(),
    );
    run["children"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            json(
                &kavi_command(root, &["runs", "show", &c["id"].to_string(), "--json"])
                    .output()
                    .unwrap(),
            )
        })
        .collect()
}

fn builds(root: &Path) -> Vec<Value> {
    let out = kavi_command(root, &["builds", "list", "word_count", "--json"])
        .output()
        .unwrap();
    json(&out).as_array().unwrap().clone()
}

fn artifact(root: &Path, sha: &Value) -> String {
    let sha = sha.as_str().unwrap();
    std::fs::read_to_string(
        root.join(".kavi/artifacts/sha256")
            .join(&sha[..2])
            .join(sha),
    )
    .unwrap()
}

/// Every byte kavi keeps: the ledger file and every artifact.
fn everything_kept(root: &Path) -> Vec<u8> {
    walkdir::WalkDir::new(root.join(".kavi"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_type().is_file())
        .flat_map(|entry| std::fs::read(entry.path()).unwrap_or_default())
        .collect()
}

#[test]
fn a_revised_packet_from_the_gateway_reaches_the_next_attempt_and_both_packets_are_kept() {
    let hint = "## Hint from the advisor\n\nCount characters including the newline.";
    let gateway = StandIn::start(move |request| {
        let revised = format!("{}\n\n{hint}\n", packet_in(request.prompt()));
        (200, completion(&revised))
    });
    let dir = shipped_workspace();
    let root = dir.path();
    let out = forge(root, &format!("{}/v1", gateway.origin), &[], "1=test");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );

    // The stand-in was asked once, in the chat-completions format, with the configured model and
    // the API key as a bearer token.
    let received = gateway.received();
    assert_eq!(received.len(), 1);
    let request = &received[0];
    assert_eq!(request.request_line, "POST /v1/chat/completions HTTP/1.1");
    assert_eq!(request.body["model"], "stand-in-model");
    assert_eq!(request.body["messages"][0]["role"], "system");
    assert_eq!(request.body["messages"][1]["role"], "user");
    assert_eq!(
        request.header("authorization"),
        Some(format!("Bearer {API_KEY}").as_str())
    );
    assert!(
        request
            .prompt()
            .contains("Failure kind: VERIFY_TEST, at step `verify`.")
    );
    assert!(request.prompt().contains("# Build packet: `word_count`"));

    let attempts = attempts(root);
    assert_eq!(attempts.len(), 2);
    let advise = node(&attempts[0], "advise");
    assert_eq!(advise["state"], "succeeded");
    assert_eq!(advise["outputs"]["prompt_truncated"], false);
    assert_eq!(
        node(&attempts[0], "escalate")["outputs"]["triggers"],
        json!([])
    );

    // The ledger keeps both packets and the advisory between them; the second packet quotes it.
    let builds = builds(root);
    assert_eq!(builds.len(), 2);
    let first_packet = artifact(root, &builds[0]["packet"]);
    let advisory = artifact(root, &builds[0]["advisory"]);
    let second_packet = artifact(root, &builds[1]["packet"]);
    assert!(builds[0]["advisory_error"].is_null());
    assert!(advisory.starts_with("# Build packet: `word_count`"));
    assert!(advisory.trim_end().ends_with(hint), "{advisory}");
    assert!(!first_packet.contains("## Advisory"));
    assert!(second_packet.contains("## Advisory"), "{second_packet}");
    assert!(second_packet.contains(hint), "{second_packet}");
    assert_ne!(builds[0]["packet"], builds[1]["packet"]);

    // The API key reached the gateway and nothing else.
    let kept = everything_kept(root);
    assert!(
        !kept.windows(API_KEY.len()).any(|w| w == API_KEY.as_bytes()),
        "the API key was written to the ledger or an artifact"
    );
}

#[test]
fn a_closed_gateway_port_is_ambiguous_and_the_run_ends_deterministically() {
    // Bind a port, then close it: nothing listens there.
    let closed = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}/v1", listener.local_addr().unwrap())
    };
    let dir = shipped_workspace();
    let root = dir.path();
    let out = forge(root, &closed, &[], "1=test");
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let attempts = attempts(root);
    assert_eq!(attempts.len(), 1, "AMBIGUOUS stops the loop");
    let advise = node(&attempts[0], "advise");
    assert_eq!(advise["state"], "failed");
    assert!(
        advise["error"].as_str().unwrap().contains("is unreachable"),
        "{advise}"
    );
    let escalate = node(&attempts[0], "escalate");
    let triggers = &escalate["outputs"]["triggers"];
    assert_eq!(triggers.as_array().unwrap().len(), 1, "{triggers}");
    assert_eq!(triggers[0]["trigger"], "AMBIGUOUS");
    assert!(
        triggers[0]["reason"]
            .as_str()
            .unwrap()
            .starts_with("no advisory: http://127.0.0.1:"),
        "{triggers}"
    );
    let builds = builds(root);
    assert!(builds[0]["advisory"].is_null());
    assert!(
        builds[0]["advisory_error"]
            .as_str()
            .unwrap()
            .contains("unreachable")
    );
    // Approving goes on deterministically: attempt 2 passes without any advisory.
    let approved = kavi_with_gateway(root, &closed, &[], &["approve", "latest"]);
    assert!(
        approved.status.success(),
        "{}",
        String::from_utf8_lossy(&approved.stdout)
    );
    let shown = json(
        &kavi_command(root, &["skill", "show", "word_count", "--json"])
            .output()
            .unwrap(),
    );
    assert_eq!(shown["skill"]["state"], "TRUSTED");
}

#[test]
fn an_advisory_that_widens_permissions_or_rewrites_the_packet_goes_to_a_person() {
    // A short answer that asks for the network: a permission widening, and most of the packet
    // gone. The prompt is bounded by max_prompt_chars.
    let gateway = StandIn::start(|_| {
        (
            200,
            completion("# Build packet\n\nUse network access to fetch the expected counts."),
        )
    });
    let dir = shipped_workspace();
    let root = dir.path();
    let out = forge(
        root,
        &format!("{}/v1", gateway.origin),
        &[("KAVI_GATEWAY_MAX_PROMPT_CHARS", "600")],
        "1=test",
    );
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let received = gateway.received();
    assert_eq!(received[0].prompt().chars().count(), 600);
    let attempts = attempts(root);
    assert_eq!(
        node(&attempts[0], "advise")["outputs"]["prompt_truncated"],
        true
    );
    let triggers: Vec<String> = node(&attempts[0], "escalate")["outputs"]["triggers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| {
            format!(
                "{}: {}",
                t["trigger"].as_str().unwrap(),
                t["reason"].as_str().unwrap()
            )
        })
        .collect();
    assert_eq!(triggers.len(), 2, "{triggers:?}");
    assert_eq!(
        triggers[0],
        "PERMISSION_WIDENING: the advisory adds network"
    );
    assert!(
        triggers[1].starts_with("LARGE_DIFF: the advisory rewrites "),
        "{triggers:?}"
    );
    // The loop stopped: no second attempt used the advisory.
    assert_eq!(attempts.len(), 1);
}

#[test]
fn a_nonsense_answer_is_ambiguous() {
    let gateway = StandIn::start(|_| (200, json!({ "error": { "message": "overloaded" } })));
    let dir = shipped_workspace();
    let root = dir.path();
    let out = forge(root, &format!("{}/v1", gateway.origin), &[], "1=test");
    assert_eq!(out.status.code(), Some(6));
    let attempts = attempts(root);
    let advise = node(&attempts[0], "advise");
    assert_eq!(
        advise["outputs"]["unavailable"],
        "the gateway answered nonsense: no text at choices[0].message.content"
    );
    assert_eq!(
        node(&attempts[0], "escalate")["outputs"]["triggers"][0]["reason"],
        "no advisory: the gateway answered nonsense: no text at choices[0].message.content"
    );
}

#[test]
fn research_by_hand_classifies_a_build_and_asks_for_advice() {
    let gateway = StandIn::start(|request| {
        let revised = format!("{}\n\nMind the newline.\n", packet_in(request.prompt()));
        (200, completion(&revised))
    });
    let dir = shipped_workspace();
    let root = dir.path();
    // No gateway during the run: the forge classifies, skips the advisory and retries.
    let args = forge_args("1=syntax");
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let out = kavi_command(root, &args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(node(&attempts(root)[0], "advise")["state"], "skipped");

    let research = kavi_with_gateway(
        root,
        &format!("{}/v1", gateway.origin),
        &[],
        &["research", "1", "--advise", "--json"],
    );
    let research = json(&research);
    assert_eq!(research["kind"], "VERIFY_LINT");
    assert_eq!(research["facts"]["node"], "verify");
    assert_eq!(research["attempt"], 1);
    assert!(research["advice"]["advisory"].is_string());
    let builds = builds(root);
    assert_eq!(builds[0]["research_note"], research["note"]);
    assert_eq!(builds[0]["advisory"], research["advice"]["advisory"]);

    // A build whose attempt passed has nothing to classify.
    let passed = kavi_command(root, &["research", "2"]).output().unwrap();
    assert_eq!(passed.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&passed.stderr).contains("there is nothing to classify"),
        "{}",
        String::from_utf8_lossy(&passed.stderr)
    );
}
