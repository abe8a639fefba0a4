//! `kavi serve`, the review page, driven by a real headless Chromium through chromedriver
//! (WebDriver) against a real server on a workspace whose forge run stopped for review: what a
//! reviewer reads, and a decision made in the browser that the CLI and the ledger then see as
//! `kavi approve`'s. Screenshots of the pages are kept under target/tmp/serve-screenshots/.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fantoccini::{Client, ClientBuilder, Locator};
use hyper_util::client::legacy::connect::HttpConnector;

use crate::common::{self, json, kavi, shipped_workspace};

/// A `kavi serve` of a workspace on a port the system chose, stopped when dropped.
struct Served {
    child: Child,
    /// The address, without the key: a name of loopback made for this start and the port.
    url: String,
    /// Where that name leads: the socket listened on.
    addr: SocketAddr,
    /// The key the server printed, which every request must carry.
    key: String,
    /// What the server printed after its first line: the resumed runs' progress.
    output: Arc<Mutex<String>>,
}

impl Drop for Served {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Served {
    fn start(root: &Path) -> Served {
        let mut child = common::kavi_command(root, &["serve", "--bind", "127.0.0.1:0"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let first = lines.next().unwrap().unwrap();
        let (url, key) = first
            .split_whitespace()
            .find(|w| w.starts_with("http://kavi-"))
            .and_then(|address| address.split_once("/?key="))
            .unwrap_or_else(|| panic!("no address with a key in {first:?}"));
        let (url, key) = (url.to_owned(), key.to_owned());
        let (name, port) = url.trim_start_matches("http://").split_once(':').unwrap();
        assert!(name.ends_with(".localhost"), "{url}");
        let addr = SocketAddr::from(([127, 0, 0, 1], port.parse().unwrap()));
        let output = Arc::new(Mutex::new(String::new()));
        let kept = output.clone();
        std::thread::spawn(move || {
            for line in lines.map_while(Result::ok) {
                let mut kept = kept.lock().unwrap();
                kept.push_str(&line);
                kept.push('\n');
            }
        });
        Served {
            child,
            url,
            addr,
            key,
            output,
        }
    }

    /// Opens the page in `client` with the key, so that its cookie goes with every later page.
    async fn sign_in(&self, client: &Client) {
        client
            .goto(&format!("{}/?key={}", self.url, self.key))
            .await
            .unwrap();
    }

    /// An HTTP client that sends the key's cookie with every request.
    fn http(&self) -> reqwest::Client {
        self.client(&format!("kavi_key={}", self.key))
    }

    /// An HTTP client that sends `cookie` with every request, and reaches the printed name
    /// (as browsers do, it leads to loopback).
    fn client(&self, cookie: &str) -> reqwest::Client {
        let mut headers = reqwest::header::HeaderMap::new();
        if !cookie.is_empty() {
            headers.insert(reqwest::header::COOKIE, cookie.parse().unwrap());
        }
        let name = self.url.trim_start_matches("http://").split(':').next();
        reqwest::Client::builder()
            .resolve(name.unwrap(), self.addr)
            .default_headers(headers)
            .build()
            .unwrap()
    }

    /// Sends SIGTERM and waits for the server to end; its exit code. A server that does not end
    /// within a minute fails the test.
    fn terminate(mut self) -> Option<i32> {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status.code();
            }
            assert!(
                Instant::now() < deadline,
                "the server did not end on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits for the server to print a line containing `text` (a resumed run ending).
    fn wait_for(&self, text: &str) -> String {
        let deadline = Instant::now() + Duration::from_secs(600);
        loop {
            let output = self.output.lock().unwrap().clone();
            if output.contains(text) {
                return output;
            }
            assert!(
                Instant::now() < deadline,
                "never printed {text:?}: {output}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// chromedriver and the headless Chromium it drives, stopped when dropped.
struct Browser {
    driver: Child,
    client: Option<Client>,
}

impl Drop for Browser {
    /// Ends chromedriver and the Chromium it started: they are a process group of their own,
    /// which no session left open (a test that failed midway) outlives.
    fn drop(&mut self) {
        let group = nix::unistd::Pid::from_raw(i32::try_from(self.driver.id()).unwrap());
        let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
        let _ = self.driver.wait();
    }
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Debian's chromium and chromium-driver, started; `None`, saying why, where they are not
/// installed (under CI, which installs them, a failure).
async fn browser_or_skip() -> Option<Browser> {
    let installed = |program: &str| {
        Command::new(program)
            .arg("--version")
            .output()
            .is_ok_and(|out| out.status.success())
    };
    if !installed("chromedriver") || !installed("chromium") {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must drive a browser: chromium and chromedriver (.ci/run installs them)"
        );
        eprintln!(
            "skipping: the review page's browser tests need chromium and chromedriver \
             (apt-get install -y chromium chromium-driver)"
        );
        return None;
    }
    let port = free_port();
    use std::os::unix::process::CommandExt as _;
    let driver = Command::new("chromedriver")
        .arg(format!("--port={port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .unwrap();
    let mut browser = Browser {
        driver,
        client: None,
    };
    let deadline = Instant::now() + Duration::from_secs(30);
    while TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(Instant::now() < deadline, "chromedriver did not listen");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut capabilities = serde_json::Map::new();
    capabilities.insert(
        "goog:chromeOptions".into(),
        serde_json::json!({
            // Root has no user namespace sandbox for Chromium here; the pages are kavi's own.
            "args": ["--headless=new", "--no-sandbox", "--disable-gpu",
                     "--disable-dev-shm-usage", "--window-size=1280,1400"]
        }),
    );
    let client = ClientBuilder::new(HttpConnector::new())
        .capabilities(capabilities)
        .connect(&format!("http://127.0.0.1:{port}"))
        .await
        .expect("chromedriver starts a headless Chromium");
    browser.client = Some(client);
    Some(browser)
}

fn screenshots() -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-screenshots");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

async fn screenshot(client: &Client, name: &str) {
    let png = client.screenshot().await.unwrap();
    std::fs::write(screenshots().join(format!("{name}.png")), png).unwrap();
}

/// The text of the element `css` selects, once the page holding it has loaded (a click on a
/// form's button returns before the answer to the post is shown).
async fn text_of(client: &Client, css: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let element = client
            .wait()
            .at_most(Duration::from_secs(120))
            .for_element(Locator::Css(css))
            .await
            .unwrap_or_else(|e| panic!("no {css}: {e}"));
        match element.text().await {
            Ok(text) => return text,
            // The next page replaced the one the element was found on (a post's answer
            // arriving in between): find it again on the page shown now.
            Err(fantoccini::error::CmdError::Standard(e))
                if e.error == fantoccini::error::ErrorStatus::StaleElementReference
                    && Instant::now() < deadline => {}
            Err(e) => panic!("reading {css}: {e}"),
        }
    }
}

/// Clicks the button whose id is `id` on the page shown.
async fn press(client: &Client, id: &str) {
    let page = client.find(Locator::Css("html")).await.unwrap();
    client
        .find(Locator::Id(id))
        .await
        .unwrap_or_else(|e| panic!("no #{id}: {e}"))
        .click()
        .await
        .unwrap();
    // A form's answer is a new page: what is read next is read from it, not from the page the
    // button was on while the answer is on its way (a loaded browser took a while).
    let deadline = Instant::now() + Duration::from_secs(30);
    while page.text().await.is_ok() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Why the CLI refuses `args` (exit 2), as it says it on stderr without `error: `.
fn refusal(root: &Path, args: &[&str]) -> String {
    let out = kavi(root, args);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    let said = String::from_utf8_lossy(&out.stderr);
    said.trim().trim_start_matches("error: ").to_owned()
}

/// The forge of `write_note` whose first attempt imports `subprocess`: the policy gate fails,
/// the classifier calls it VERIFY_POLICY with a research note, and the run stops for review.
fn stopped_for_review(root: &Path) {
    let out = kavi(
        root,
        &[
            "pipeline",
            "run",
            "forge",
            "--set",
            "skill=write_note",
            "--set",
            "flaws=1=policy",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(6),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_reviewer_reads_the_evidence_and_approves_in_the_browser_as_kavi_approve_does() {
    let Some(browser) = browser_or_skip().await else {
        return;
    };
    let client = browser.client.as_ref().unwrap();
    let dir = shipped_workspace();
    let root = dir.path();
    stopped_for_review(root);
    let served = Served::start(root);
    served.sign_in(client).await;

    // The queue lists the stopped run with what it awaits.
    client.goto(&served.url).await.unwrap();
    let queue = text_of(client, "main table").await;
    assert!(
        queue.contains("run 1") && queue.contains("write_note: SECURITY_CLASS"),
        "{queue}"
    );
    screenshot(client, "queue").await;

    client
        .find(Locator::LinkText("run 1"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    // The builder's files as a diff: write_note was never trusted, so each file is added, and
    // the import the policy gate refused is in it.
    let files = text_of(client, "section[aria-labelledby='files-write_note']").await;
    assert!(
        files.contains("skills/write_note/skill.py: added")
            && files.contains("+++ b/skills/write_note/skill.py")
            && files.contains("+import subprocess"),
        "{files}"
    );
    // The gates' findings, each gate's result in words.
    let gates = text_of(client, "section[aria-labelledby='gates']").await;
    let gates = gates.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(
        gates.contains("classified VERIFY_POLICY")
            && gates.contains(
                "policy policy_scan failed skills/write_note/skill.py:4:1: [process] starts a \
                 process: imports `subprocess`"
            ),
        "{gates}"
    );
    // The research note is the one the ledger keeps for build 1.
    let builds = json(&kavi(root, &["builds", "list", "write_note", "--json"]));
    let note_hash = builds[0]["research_note"].as_str().unwrap();
    let note = kavi(root, &["artifact", "cat", note_hash]);
    let note = String::from_utf8(note.stdout).unwrap();
    assert!(note.contains("VERIFY_POLICY"), "{note}");
    assert_eq!(text_of(client, "pre.note").await.trim(), note.trim());
    // Who decides, and the roles the adopted rules give that account (recorded with it).
    let who = text_of(client, "section[aria-labelledby='decide'] p").await;
    let me = kavi::identity::actor();
    // The shipped policies/roles.toml gives every account both roles.
    assert_eq!(
        who,
        format!("You decide as {me}, holding maintainer, reviewer in the adopted rules.")
    );
    screenshot(client, "evidence").await;
    // A second tab with the same page, left open while the first decides.
    let first_tab = client.window().await.unwrap();
    let run_page = client.current_url().await.unwrap();
    let second_tab = client.new_window(true).await.unwrap().handle;
    client.switch_to_window(second_tab.clone()).await.unwrap();
    client.goto(run_page.as_str()).await.unwrap();
    client.switch_to_window(first_tab).await.unwrap();

    // An approval from the page: recorded as the account running the server, and the run
    // resumed as `kavi approve` resumes it.
    client
        .find(Locator::Id("comment"))
        .await
        .unwrap()
        .send_keys("the import was the drill's")
        .await
        .unwrap();
    press(client, "approve").await;
    text_of(client, "ul[role=status]").await;
    let decided = text_of(client, "main").await;
    assert!(
        decided.contains("run 1 approved")
            && decided.contains(&format!("approved `write_note` by {me}"))
            && decided.contains("resuming run 1 (pipelines/forge.toml)"),
        "{decided}"
    );
    screenshot(client, "decided").await;
    served.wait_for("the resumed run of run 1 ended (0)");
    let first = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(first["status"], "approved");
    let recorded = common::LedgerConnection::open(root)
        .texts("SELECT decided_by || ' ' || comment FROM escalations");
    assert_eq!(recorded, [format!("{me} the import was the drill's")]);
    // As after `kavi approve 1` (forge.rs): attempt 2 is built after attempt 1 and promoted.
    let builds = json(&kavi(root, &["builds", "list", "write_note", "--json"]));
    assert_eq!(builds[1]["attempt"], 2);
    assert_eq!(builds[1]["parent_build"], builds[0]["id"]);
    let shown = json(&kavi(root, &["skill", "show", "write_note", "--json"]));
    assert_eq!(shown["skill"]["state"], "TRUSTED");

    // The same account approves again from the tab shown before the decision: the run changed
    // since that page was shown, so nothing is recorded.
    client.switch_to_window(second_tab).await.unwrap();
    press(client, "approve").await;
    let refused = text_of(client, "main [role=alert]").await;
    assert!(
        refused.starts_with("refused: run 1 changed since the page was shown (it is approved now)"),
        "{refused}"
    );
    screenshot(client, "refused").await;
    let again = common::LedgerConnection::open(root)
        .texts("SELECT decided_by || ' ' || comment FROM escalations");
    assert_eq!(again, recorded);
    // The queue is empty now, and the run's page has no form.
    client.goto(&served.url).await.unwrap();
    assert!(
        text_of(client, "main")
            .await
            .contains("No run awaits review.")
    );
    client
        .goto(&format!("{}/runs/1", served.url))
        .await
        .unwrap();
    assert!(client.find(Locator::Id("approve")).await.is_err());

    // A node's page: why it ran, as `kavi explain` says, and its log, as `kavi runs logs`.
    client
        .goto(&format!("{}/runs/2", served.url))
        .await
        .unwrap();
    client
        .find(Locator::LinkText("verify"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let explained = json(&kavi(root, &["explain", "2", "verify", "--json"]));
    assert_eq!(
        text_of(client, "p.because").await,
        explained["because"].as_str().unwrap()
    );
    screenshot(client, "node").await;
    client
        .goto(&format!("{}/runs/2/nodes/build", served.url))
        .await
        .unwrap();
    let logs = kavi(root, &["runs", "logs", "2", "build"]);
    let logs = String::from_utf8(logs.stdout).unwrap();
    assert!(!logs.trim().is_empty());
    assert_eq!(text_of(client, "pre.log").await.trim(), logs.trim());

    // The skill's page: its lifecycle as `kavi skill show` has it, the approval among its moves.
    client
        .goto(&format!("{}/skills/write_note", served.url))
        .await
        .unwrap();
    assert_eq!(text_of(client, "h1 .state").await, "TRUSTED");
    let moves = text_of(client, "section[aria-labelledby='moves'] tbody").await;
    let recorded = shown["transitions"].as_array().unwrap();
    assert_eq!(moves.lines().count(), recorded.len(), "{moves}");
    screenshot(client, "skill").await;
    // The ledger verifies, as `kavi ledger verify` says.
    let verified = json(&kavi(root, &["ledger", "verify", "--json"]));
    client
        .goto(&format!("{}/ledger", served.url))
        .await
        .unwrap();
    assert_eq!(
        text_of(client, "main [role=status]").await,
        format!(
            "OK: {} journal entries chain, and every row, spec and artifact matches them.",
            verified["entries"]
        )
    );
    common::assert_ledger_verifies(root);
    // Having resumed a run (which takes SIGTERM to cancel itself), the server still ends on
    // SIGTERM, as a cancelled command does.
    assert_eq!(served.terminate(), Some(143));
}

/// With `self_approval = false`, the account that started a run may not approve it: the page
/// refuses it with `kavi approve`'s own reason, and the run still awaits review.
#[tokio::test(flavor = "multi_thread")]
async fn the_page_refuses_what_kavi_approve_refuses() {
    let Some(browser) = browser_or_skip().await else {
        return;
    };
    let client = browser.client.as_ref().unwrap();
    let dir = shipped_workspace();
    let root = dir.path();
    let rules = root.join("policies/escalation.toml");
    let text = std::fs::read_to_string(&rules).unwrap();
    std::fs::write(
        &rules,
        text.replace("self_approval = true", "self_approval = false"),
    )
    .unwrap();
    stopped_for_review(root);
    let served = Served::start(root);
    served.sign_in(client).await;
    client
        .goto(&format!("{}/runs/1", served.url))
        .await
        .unwrap();
    press(client, "approve").await;
    let refused = text_of(client, "main [role=alert]").await;
    let reason = refusal(root, &["approve", "1", "--no-resume"]);
    assert!(
        reason.contains("forbid approving a run by the account that started it"),
        "{reason}"
    );
    assert_eq!(
        refused,
        format!("refused: {reason}; nothing was decided"),
        "the page and the CLI refuse alike"
    );
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(run["status"], "awaiting_review");

    // Allowing self-approval again weakens the adopted rules: a rule change its proposer may not
    // approve, on the page as with `kavi policy approve`.
    std::fs::write(&rules, &text).unwrap();
    let proposed = kavi(root, &["policy", "propose", "-m", "allow self-approval"]);
    assert!(proposed.status.success(), "{proposed:?}");
    client
        .goto(&format!("{}/runs/1", served.url))
        .await
        .unwrap();
    press(client, "approve-rules-2").await;
    let refused = text_of(client, "main [role=alert]").await;
    let reason = refusal(root, &["policy", "approve", "2"]);
    assert_eq!(refused, format!("refused: {reason}; nothing was decided"));
    let pending = common::LedgerConnection::open(root)
        .texts("SELECT status || ' ' || coalesce(approvals, 'none') FROM rule_sets WHERE id = 2");
    assert_eq!(pending.len(), 1);
    assert!(pending[0].starts_with("pending "), "{pending:?}");
}

/// The hidden fields of the decision form on `page`.
fn field(page: &str, name: &str) -> String {
    let marker = format!("name=\"{name}\" value=\"");
    let at = page.find(&marker).unwrap_or_else(|| panic!("no {name}")) + marker.len();
    page[at..].split('"').next().unwrap().to_owned()
}

/// A decision posted from elsewhere: another site's `Origin`, no token, a token of another
/// server, or a page of a run that changed since: each refused, and nothing recorded.
#[tokio::test(flavor = "multi_thread")]
async fn a_post_without_the_token_or_from_another_origin_is_refused_and_records_nothing() {
    let dir = shipped_workspace();
    let root = dir.path();
    stopped_for_review(root);
    let served = Served::start(root);
    // Without the key (another account of this machine, which can reach loopback but did not
    // start the server), or with a wrong one: no page, no token, no decision.
    let stranger = served.client("");
    for cookie in ["", "kavi_key=guessed"] {
        let answer = served
            .client(cookie)
            .get(format!("{}/runs/1", served.url))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 401, "{cookie}");
        let body = answer.text().await.unwrap();
        assert!(!body.contains("name=\"token\""), "{body}");
        assert!(body.contains("holds its key"), "{body}");
    }
    let http = served.http();
    let page = http
        .get(format!("{}/runs/1", served.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let (token, seen) = (field(&page, "token"), field(&page, "seen"));
    let keyless = stranger
        .post(format!("{}/runs/1/decide", served.url))
        .header("Origin", served.url.as_str())
        .form(&[
            ("token", token.as_str()),
            ("seen", &seen),
            ("verdict", "approve"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(keyless.status().as_u16(), 401);
    let post = |origin: &str, form: Vec<(&str, &str)>| {
        http.post(format!("{}/runs/1/decide", served.url))
            .header("Origin", origin)
            .form(&form)
            .send()
    };
    let ours = served.url.as_str();
    let cases = [
        (
            "http://attacker.example",
            vec![
                ("token", token.as_str()),
                ("seen", &seen),
                ("verdict", "approve"),
            ],
            403,
            "not sent from this server",
        ),
        (
            ours,
            vec![
                ("token", "guessed"),
                ("seen", &seen),
                ("verdict", "approve"),
            ],
            403,
            "token is not this server",
        ),
        (
            ours,
            vec![
                ("token", token.as_str()),
                ("seen", "an older page"),
                ("verdict", "reject"),
            ],
            409,
            "run 1 changed since the page was shown (it is awaiting_review now)",
        ),
    ];
    for (origin, form, status, reason) in cases {
        let answer = post(origin, form).await.unwrap();
        assert_eq!(answer.status().as_u16(), status, "{reason}");
        let body = answer.text().await.unwrap();
        assert!(body.contains(reason), "{reason}: {body}");
        assert!(body.contains("nothing was recorded"), "{body}");
    }
    // A page of another site whose name resolves here (DNS rebinding) reads nothing: its
    // requests name that site. Nor does a request, key and all, to another name of loopback:
    // the server answers to the name it printed only, and the refusal does not say it.
    let (name, port) = served
        .url
        .trim_start_matches("http://")
        .split_once(':')
        .unwrap();
    for host in ["rebound.example", "127.0.0.1", "localhost", "[::1]"] {
        let answer = http
            .get(format!("{}/runs/1", served.url))
            .header("Host", format!("{host}:{port}"))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), 421, "{host}");
        let body = answer.text().await.unwrap();
        assert!(
            body.contains("answers only to the address `kavi serve` printed"),
            "{body}"
        );
        assert!(!body.contains(&token), "the token reached {host}");
        assert!(!body.contains(name), "the name was told to {host}");
    }
    // Without a token at all the form is not one.
    let answer = http
        .post(format!("{}/runs/1/decide", served.url))
        .header("Origin", ours)
        .form(&[("seen", seen.as_str()), ("verdict", "approve")])
        .send()
        .await
        .unwrap();
    assert!(answer.status().is_client_error(), "{}", answer.status());
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    assert_eq!(run["status"], "awaiting_review");
    let decided = common::LedgerConnection::open(root)
        .texts("SELECT status || ' ' || coalesce(approvals, 'none') FROM escalations");
    assert_eq!(decided, ["pending none"]);
}

/// A server of another account on loopback: answers every request with a page and keeps the
/// headers each request came with.
fn another_server() -> (u16, Arc<Mutex<Vec<String>>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let heard = Arc::new(Mutex::new(Vec::new()));
    let kept = heard.clone();
    std::thread::spawn(move || {
        for mut stream in listener.incoming().map_while(Result::ok) {
            let mut head = Vec::new();
            let mut byte = [0u8];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).is_ok_and(|n| n == 1) {
                head.push(byte[0]);
            }
            kept.lock()
                .unwrap()
                .push(String::from_utf8_lossy(&head).into_owned());
            let page = "<!doctype html><title>another server</title><p>hello";
            let _ = write!(
                stream,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\n\
                 Connection: close\r\n\r\n{page}",
                page.len()
            );
        }
    });
    (port, heard)
}

/// The key's cookie goes to kavi's server only. A browser sends a cookie to every port of the
/// host that set it, so had the page been served as 127.0.0.1 (or localhost), the browser that
/// opened it would hand the key to any other account's server there, which would then decide as
/// the account running kavi. Here the real browser opens the printed address, then pages of
/// another server on loopback: none of its requests carries the key.
#[tokio::test(flavor = "multi_thread")]
async fn the_keys_cookie_is_sent_to_no_other_server_on_loopback() {
    let Some(browser) = browser_or_skip().await else {
        return;
    };
    let client = browser.client.as_ref().unwrap();
    let dir = shipped_workspace();
    let served = Served::start(dir.path());
    served.sign_in(client).await;
    // Signed in: the cookie is set, and a page without `?key=` is answered.
    client.goto(&format!("{}/runs", served.url)).await.unwrap();
    let heading = text_of(client, "main h1").await;
    assert!(heading.contains("Runs"), "{heading}");
    let (port, heard) = another_server();
    for host in ["127.0.0.1", "localhost"] {
        client
            .goto(&format!("http://{host}:{port}/page"))
            .await
            .unwrap();
        assert_eq!(text_of(client, "p").await, "hello", "{host}");
    }
    let heard = heard.lock().unwrap().clone();
    assert!(
        heard
            .iter()
            .filter(|head| head.starts_with("GET /page "))
            .count()
            >= 2,
        "the browser reached the other server for each page: {heard:?}"
    );
    for head in &heard {
        assert!(
            !head.contains("kavi_key") && !head.contains(&served.key),
            "the key went to another server: {head}"
        );
    }
}

/// The printed name leads to 127.0.0.1 and ::1 both, so the server holds its port on both: a
/// port whose other loopback address another process holds is refused (that process would be
/// sent the key by a browser trying ::1 first).
#[test]
fn a_port_another_process_holds_on_the_other_loopback_address_is_refused() {
    let dir = shipped_workspace();
    let Ok(taken) = TcpListener::bind("[::1]:0") else {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must: an IPv6 loopback address (::1)"
        );
        eprintln!("skipping: this machine has no IPv6 loopback, which nobody can then hold");
        return;
    };
    let port = taken.local_addr().unwrap().port();
    let out = kavi(
        dir.path(),
        &["serve", "--bind", &format!("127.0.0.1:{port}")],
    );
    assert_eq!(out.status.code(), Some(4), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains(&format!(
            "refusing to serve on loopback port {port}: another process holds [::1]:{port}"
        )),
        "{stderr}"
    );
    let out = kavi(dir.path(), &["serve", "--bind", "127.0.0.2:0"]);
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("browsers resolve to 127.0.0.1 and ::1"),
        "{out:?}"
    );
}

/// A bind address other than loopback is refused unless asked for: whoever reaches the port
/// decides as the account running kavi.
#[test]
fn serving_beyond_loopback_needs_allow_remote() {
    let dir = shipped_workspace();
    let out = kavi(dir.path(), &["serve", "--bind", "0.0.0.0:0"]);
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("refusing to serve on 0.0.0.0:0: it is not a loopback address")
            && stderr.contains("--allow-remote"),
        "{stderr}"
    );
}

/// A workspace of its own settings only, the defaults.
fn empty_workspace() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("kavi.toml"), "").unwrap();
    dir
}

/// Writes the pipeline `name` in the workspace at `root`.
fn write_pipeline(root: &Path, name: &str, text: &str) {
    std::fs::create_dir_all(root.join("pipelines")).unwrap();
    std::fs::write(root.join(format!("pipelines/{name}.toml")), text).unwrap();
}

/// A pipeline of four nodes, `a` before `b` and `c`, both before `d`, where `c` fails and so
/// `d` is blocked (not the shipped `diamond`, which succeeds), written and run once.
fn ran_a_split(root: &Path) {
    write_pipeline(
        root,
        "split",
        r#"[pipeline]
name = "split"

[nodes.a]
kind = "exec"
run = ["true"]

[nodes.b]
kind = "exec"
needs = ["a"]
run = ["true"]

[nodes.c]
kind = "exec"
needs = ["a"]
run = ["false"]

[nodes.d]
kind = "exec"
needs = ["b", "c"]
run = ["true"]
"#,
    );
    let out = kavi(root, &["pipeline", "run", "split"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
}

/// The run page draws the run's graph from the spec it kept, as inline SVG rendered on the
/// server: each node a link to its page naming it and its state in words, in the layer of its
/// longest path, so `d` stands right of both `b` and `c`, which stand right of `a`.
#[tokio::test(flavor = "multi_thread")]
async fn a_runs_graph_is_drawn_with_each_nodes_state_in_words() {
    let Some(browser) = browser_or_skip().await else {
        return;
    };
    let client = browser.client.as_ref().unwrap();
    let dir = empty_workspace();
    let root = dir.path();
    ran_a_split(root);
    let run = json(&kavi(root, &["runs", "show", "1", "--json"]));
    let served = Served::start(root);
    served.sign_in(client).await;
    client
        .goto(&format!("{}/runs/1", served.url))
        .await
        .unwrap();
    let links = client
        .wait()
        .at_most(Duration::from_secs(60))
        .for_element(Locator::Css("section[aria-labelledby='graph'] svg"))
        .await
        .unwrap()
        .find_all(Locator::Css("a"))
        .await
        .unwrap();
    let mut drawn = Vec::new();
    for link in &links {
        let label = link.attr("aria-label").await.unwrap().unwrap();
        // The state is written in the box, not only its colour.
        let text = link.text().await.unwrap();
        let rect = link.find(Locator::Css("rect")).await.unwrap();
        let x: u32 = rect.attr("x").await.unwrap().unwrap().parse().unwrap();
        let y: u32 = rect.attr("y").await.unwrap().unwrap().parse().unwrap();
        let words: Vec<String> = text.split_whitespace().map(str::to_owned).collect();
        drawn.push((label, words, x, y));
    }
    let expected: Vec<String> = ["a", "b", "c", "d"]
        .iter()
        .map(|id| {
            let state = common::node(&run, id)["state"].as_str().unwrap();
            format!("{id}: {state}")
        })
        .collect();
    let labels: Vec<&str> = drawn.iter().map(|(label, ..)| label.as_str()).collect();
    assert_eq!(labels, expected);
    assert_eq!(
        expected[2..],
        ["c: failed".to_owned(), "d: blocked".to_owned()]
    );
    for (label, words, ..) in &drawn {
        let (id, state) = label.split_once(": ").unwrap();
        assert_eq!(words, &[id, state], "{label}");
    }
    let (a, b, c, d) = (&drawn[0], &drawn[1], &drawn[2], &drawn[3]);
    assert!(a.2 < b.2 && b.2 == c.2 && c.2 < d.2, "{drawn:?}");
    assert_ne!(b.3, c.3, "b and c share a layer, one above the other");
    screenshot(client, "graph").await;

    // Each node is a link to its page.
    links[2].click().await.unwrap();
    let heading = text_of(client, "main h1").await;
    assert_eq!(heading, "Node c of run 1 failed");
}

/// Pending rule changes wait on the review queue with approve, reject and adopt forms, which
/// decide as `kavi policy approve|reject|adopt` do, under the same token and `Origin` checks:
/// a strengthening change is adopted from the page; a weakening one is refused to its proposer,
/// in the CLI's words, and stays pending.
#[tokio::test(flavor = "multi_thread")]
async fn rule_changes_are_approved_and_adopted_from_the_queue_as_kavi_policy_does() {
    let Some(browser) = browser_or_skip().await else {
        return;
    };
    let client = browser.client.as_ref().unwrap();
    let dir = shipped_workspace();
    let root = dir.path();
    // The first run adopts the rules it runs under: here without the tests gate.
    let gates = common::drop_the_test_gate(root);
    ran_a_split(root);
    std::fs::write(root.join("policies/gates.toml"), gates).unwrap();
    let proposed = kavi(root, &["policy", "propose", "-m", "the tests gate again"]);
    assert!(
        String::from_utf8_lossy(&proposed.stdout)
            .starts_with("proposed rule change 2 (strengthening)"),
        "{proposed:?}"
    );
    let served = Served::start(root);
    served.sign_in(client).await;

    // A form posted from another site is refused, and nothing is adopted.
    let http = served.http();
    let page = http
        .get(&served.url)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let answer = http
        .post(format!("{}/rules/2/decide", served.url))
        .header("Origin", "http://attacker.example")
        .form(&[
            ("token", field(&page, "token").as_str()),
            ("seen", &field(&page, "seen")),
            ("verdict", "adopt"),
        ])
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status().as_u16(), 403);
    let status = |id: i64| {
        common::LedgerConnection::open(root).texts(&format!(
            "SELECT status || ' ' || coalesce(decided_by, '-') FROM rule_sets WHERE id = {id}"
        ))
    };
    assert_eq!(status(2), ["pending -"]);

    client.goto(&served.url).await.unwrap();
    let rules = text_of(client, "section[aria-labelledby='rules']").await;
    assert!(
        rules.contains("Pending rule change 2 (strengthening) by")
            && rules.contains("the tests gate again"),
        "{rules}"
    );
    screenshot(client, "rule-changes").await;
    press(client, "adopt-rules-2").await;
    let said = text_of(client, "main ul").await;
    let me = kavi::identity::actor();
    assert!(
        said.starts_with(&format!(
            "adopted rule change 2 (strengthening) by {me}: sha256:"
        )),
        "{said}"
    );
    assert_eq!(status(2), [format!("adopted {me}")]);
    let diff = json(&kavi(root, &["policy", "diff", "--json"]));
    assert_eq!(diff["adopted"]["id"], 2);

    // Dropping the gate again weakens the rules: its proposer may neither approve nor adopt it,
    // on the page as with the CLI.
    common::drop_the_test_gate(root);
    assert!(kavi(root, &["policy", "propose"]).status.success());
    for (button, command) in [("approve-rules-3", "approve"), ("adopt-rules-3", "adopt")] {
        client.goto(&served.url).await.unwrap();
        press(client, button).await;
        let refused = text_of(client, "main [role=alert]").await;
        let reason = refusal(root, &["policy", command, "3"]);
        assert_eq!(refused, format!("refused: {reason}; nothing was decided"));
    }
    assert_eq!(status(3), ["pending -"]);
}

/// The skills, by name with their state and versions, and a skill's page with its gate results
/// and its executions, newest first, 50 to a page: the 51st execution, the oldest, is on the
/// next page.
#[tokio::test(flavor = "multi_thread")]
async fn the_skills_and_a_skills_verifications_and_executions_are_listed_a_page_at_a_time() {
    let Some(browser) = browser_or_skip().await else {
        return;
    };
    let client = browser.client.as_ref().unwrap();
    let dir = shipped_workspace();
    let root = dir.path();
    let forged = kavi(
        root,
        &["pipeline", "run", "forge", "--set", "skill=word_count"],
    );
    assert!(forged.status.success(), "{forged:?}");
    for _ in 0..51 {
        let ran = kavi(
            root,
            &[
                "skill",
                "run",
                "word_count",
                "--input",
                r#"{"text": "a b"}"#,
            ],
        );
        assert!(ran.status.success(), "{ran:?}");
    }
    let newest = json(&kavi(root, &["executions", "tail", "-n", "51", "--json"]));
    let ids: Vec<&str> = newest
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["execution_id"].as_str().unwrap())
        .collect();
    assert_eq!(ids.len(), 51);
    let gates = common::LedgerConnection::open(root)
        .texts("SELECT gate_id FROM verifications WHERE skill = 'word_count' ORDER BY id DESC");
    assert!(!gates.is_empty());
    let served = Served::start(root);
    served.sign_in(client).await;

    client
        .goto(&format!("{}/skills", served.url))
        .await
        .unwrap();
    let listed = text_of(client, "main table tbody").await;
    let shown = json(&kavi(root, &["skill", "show", "word_count", "--json"]));
    let version = shown["skill"]["version"].to_string();
    assert!(
        listed
            .lines()
            .any(|l| l.starts_with(&format!("word_count TRUSTED {version} {version}"))),
        "{listed}"
    );
    screenshot(client, "skills").await;
    client
        .find(Locator::LinkText("word_count"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let rows = |section: &'static str| async move {
        let table = client
            .wait()
            .at_most(Duration::from_secs(60))
            .for_element(Locator::Css(&format!(
                "section[aria-labelledby='{section}'] tbody"
            )))
            .await
            .unwrap();
        let mut texts = Vec::new();
        for row in table.find_all(Locator::Css("tr")).await.unwrap() {
            texts.push(row.text().await.unwrap());
        }
        texts
    };
    // Every gate result the ledger holds for it, newest first.
    let verifications = rows("verifications").await;
    let named: Vec<&str> = verifications
        .iter()
        .map(|row| row.split_whitespace().nth(2).unwrap())
        .collect();
    assert_eq!(named, gates, "{verifications:?}");
    // The newest 50 executions, then the oldest on the next page.
    let executions = rows("executions").await;
    let first: Vec<&str> = executions
        .iter()
        .map(|row| row.split_whitespace().next().unwrap())
        .collect();
    let newest_first: Vec<&str> = ids.iter().rev().copied().collect();
    assert_eq!(first, newest_first[..50]);
    screenshot(client, "skill").await;
    client
        .find(Locator::LinkText("Older executions"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    let rest = rows("executions").await;
    assert_eq!(rest.len(), 1, "{rest:?}");
    assert!(rest[0].starts_with(ids[0]), "{rest:?}");
}

/// The live logs of node `node` in run 1, as its kavi writes them while it runs (under the
/// artifact store's temp folder, in its owner's spill folder): each stream's path and text.
fn live_logs(root: &Path, node: &str) -> Vec<(PathBuf, String)> {
    // Made and removed as it runs: what is not there (yet, or any more) is not listed.
    walkdir::WalkDir::new(root.join(".kavi"))
        .into_iter()
        .filter_map(Result::ok)
        .filter(|entry| {
            entry.file_type().is_file()
                && entry.path().parent().is_some_and(|p| p.ends_with("live"))
                && entry
                    .file_name()
                    .to_str()
                    .is_some_and(|name| name.starts_with(&format!("1.{node}.")))
        })
        .map(|entry| {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            (entry.into_path(), text)
        })
        .collect()
}

/// Waits until `ready` says yes, for at most two minutes; what it last saw fails the test.
async fn eventually<T: std::fmt::Debug>(mut look: impl AsyncFnMut() -> (bool, T)) -> T {
    let deadline = Instant::now() + Duration::from_secs(120);
    loop {
        let (ready, seen) = look().await;
        if ready {
            return seen;
        }
        assert!(Instant::now() < deadline, "never came: {seen:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A running node's page shows what it has printed so far and follows it in the browser as it
/// prints: its first line is on the page while it waits, and a line printed after the page was
/// loaded appears in it without a reload; once the node ends the page shows what the ledger
/// kept. The declared secret it prints, in two writes, is hidden on the page, in the stream the
/// page reads and in the live log file alike; and the page reads without JavaScript too.
#[tokio::test(flavor = "multi_thread")]
async fn a_running_nodes_page_follows_its_output_with_its_secret_hidden() {
    let Some(browser) = browser_or_skip().await else {
        return;
    };
    let client = browser.client.as_ref().unwrap();
    let dir = empty_workspace();
    let root = dir.path();
    // The secret goes out in two writes, half a second apart, then the node waits for `go`,
    // prints its second line, and waits for `end`.
    write_pipeline(
        root,
        "slow",
        r#"[pipeline]
name = "slow"

[nodes.talk]
kind = "exec"
secrets = ["API_TOKEN"]
shell = '''
echo first line
printf 'key=%s' "${API_TOKEN%%-*}-"; sleep 0.5; printf '%s\n' "${API_TOKEN#*-}"
echo "on stderr: $API_TOKEN" >&2
while [ ! -e go ]; do sleep 0.05; done
echo second line
while [ ! -e end ]; do sleep 0.05; done
'''
"#,
    );
    let secret = "sk-live-9876543210";
    let mut run = common::kavi_command(root, &["pipeline", "run", "slow"])
        .env("API_TOKEN", secret)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Both streams' live logs hold their lines, the secret hidden, while the node waits.
    let logs = eventually(async || {
        let logs = live_logs(root, "talk");
        let texts: Vec<&str> = logs.iter().map(|(_, text)| text.as_str()).collect();
        let ready = texts.contains(&"first line\nkey=[redacted]\n")
            && texts.contains(&"on stderr: [redacted]\n");
        (ready, logs)
    })
    .await;
    common::assert_nowhere_under(&root.join(".kavi"), secret);
    // `kavi runs logs` of the running node prints the same, from the same files.
    let so_far = kavi(root, &["runs", "logs", "1", "talk"]);
    assert_eq!(so_far.stdout, b"first line\nkey=[redacted]\n", "{so_far:?}");
    let so_far = kavi(root, &["runs", "logs", "1", "talk", "--stderr"]);
    assert_eq!(so_far.stdout, b"on stderr: [redacted]\n", "{so_far:?}");
    let served = Served::start(root);

    // Without JavaScript: the page holds what it printed so far, and a link to load it again.
    let page = served
        .http()
        .get(format!("{}/runs/1/nodes/talk", served.url))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        page.contains("first line\nkey=[redacted]\n</pre>")
            && page.contains(">Reload</a> to see more.")
            && !page.contains(secret),
        "{page}"
    );

    served.sign_in(client).await;
    client
        .goto(&format!("{}/runs/1/nodes/talk", served.url))
        .await
        .unwrap();
    assert_eq!(text_of(client, "main h1 .state").await, "running");
    let stdout = "pre[data-stream=stdout]";
    assert_eq!(text_of(client, stdout).await, "first line\nkey=[redacted]");
    assert_eq!(
        text_of(client, "pre[data-stream=stderr]").await,
        "on stderr: [redacted]"
    );
    // The script follows it: the status says so, and the next line arrives without a reload.
    assert!(
        text_of(client, "[data-live] [role=status]")
            .await
            .starts_with("Running: its output grows below as it prints"),
    );
    std::fs::write(root.join("go"), "").unwrap();
    eventually(async || {
        let text = text_of(client, stdout).await;
        (text.ends_with("second line"), text)
    })
    .await;
    assert_eq!(text_of(client, "main h1 .state").await, "running");
    screenshot(client, "running").await;
    let source = client.source().await.unwrap();
    assert!(!source.contains(secret), "{source}");

    // The node ends: the page loads again, with what the ledger kept, as `kavi runs logs` has it.
    std::fs::write(root.join("end"), "").unwrap();
    assert_eq!(run.wait().unwrap().code(), Some(0));
    eventually(async || {
        let state = text_of(client, "main h1 .state").await;
        (state == "succeeded", state)
    })
    .await;
    let kept = kavi(root, &["runs", "logs", "1", "talk"]);
    assert_eq!(kept.stdout, b"first line\nkey=[redacted]\nsecond line\n");
    assert_eq!(
        text_of(client, "pre.log").await,
        "first line\nkey=[redacted]\nsecond line"
    );
    assert!(client.find(Locator::Css("[data-live]")).await.is_err());
    // The live logs went with the node's process.
    for (path, _) in logs {
        assert!(!path.exists(), "{}", path.display());
    }
    common::assert_nowhere_under(root, secret);
}
