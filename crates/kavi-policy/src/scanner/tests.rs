//! Tests of the policy scanner: the shipped policy against Python and text samples.

use super::*;

fn shipped() -> Scanner {
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../policies/scanner.toml"
    ))
    .unwrap();
    Scanner::parse(&SourceFile::new("policies/scanner.toml", text)).unwrap()
}

fn rules(findings: &[Finding]) -> Vec<(usize, &str)> {
    findings.iter().map(|f| (f.line, f.rule.as_str())).collect()
}

/// A test that catches what its assertion raises is a finding in a test file, in each
/// spelling; the same `except` in the skill's own code is not (it may handle its errors).
#[test]
fn a_test_swallowing_its_assertion_is_a_finding_in_tests_only() {
    let text = "try:\n    check()\nexcept AssertionError:\n    pass\ntry:\n    check()\nexcept:\n    pass\n\
                try:\n    check()\nexcept (ValueError, Exception) as e:\n    pass\ntry:\n    check()\n\
                except BaseException:\n    pass\ntry:\n    check()\nexcept ValueError:\n    pass\n";
    let swallowed = [
        (3, "swallowed-assertion"),
        (7, "swallowed-assertion"),
        (11, "swallowed-assertion"),
        (15, "swallowed-assertion"),
    ];
    assert_eq!(
        rules(&shipped().scan_text("skills/x/test_skill.py", text)),
        swallowed
    );
    assert!(shipped().scan_text("skills/x/skill.py", text).is_empty());
}

#[test]
fn text_rules_fire_and_clean_code_passes() {
    let text = "print(os.environ['TOKEN'])\nlogging.info('k=%s', os.getenv('KEY'))\ntoken = os.environ['TOKEN']\n# print(os.environ['X'])\nprint('done')\n";
    assert_eq!(
        rules(&shipped().scan_text("s.py", text)),
        [(1, "secret-leak"), (2, "secret-leak")]
    );
    assert!(
        shipped()
            .scan_text("s.py", "def run(x):\n    return {'ok': x}\n")
            .is_empty()
    );
    // A bare carriage return ends a comment for Python: what follows it is code.
    assert_eq!(
        rules(&shipped().scan_text("s.py", "x = 1\n    #\r    print(os.environ)\n")),
        [(3, "secret-leak")]
    );
}

#[test]
fn a_class_set_is_forbidden_what_every_class_forbids() {
    let scanner = shipped();
    let read_only = scanner.forbidden_for(Some("READ_ONLY")).unwrap();
    assert!(read_only.contains(&"file_write".to_owned()));
    assert!(read_only.contains(&"network".to_owned()));
    // No proposal: the default class.
    assert_eq!(scanner.forbidden_for(None).unwrap(), read_only);
    let both = scanner.forbidden_for(Some("NETWORK+FILE_WRITE")).unwrap();
    assert_eq!(
        both,
        [
            "process",
            "native",
            "dynamic_code",
            "verdict",
            "unchecked_types",
            "dynamic_names",
            "environment",
            "test_doubles"
        ]
        .map(str::to_owned)
    );
    // Only SECRET_READ may read the environment whole: its secrets are there.
    let secret_read = scanner.forbidden_for(Some("SECRET_READ")).unwrap();
    assert!(!secret_read.contains(&"environment".to_owned()));
    assert!(
        !scanner
            .forbidden_for(Some("NETWORK+SECRET_READ"))
            .unwrap()
            .contains(&"environment".to_owned())
    );
    assert!(scanner.forbidden_for(Some("ROOT")).is_err());
    assert!(scanner.is_test("skills/a/test_skill.py"));
    assert!(scanner.is_test("skills/a/conftest.py"));
    assert!(!scanner.is_test("skills/a/skill.py"));
}

#[test]
fn secrets_are_found_by_format_and_never_printed() {
    let key = "AKIA".to_owned() + "IOSFODNN7EXAMPLQ";
    let token = "ghp_".to_owned() + &"a1B2".repeat(9);
    let text = format!(
        "KEY = '{key}'\nT = \"{token}\"\n-----BEGIN RSA PRIVATE KEY-----\npassword = \"hunter2hunter2\"\nslack = 'xoxb-1234567890-abcdef'\nname = 'word_count'\n"
    );
    let (findings, values) = shipped().scan_secrets("s.py", &text);
    assert_eq!(
        rules(&findings),
        [
            (1, "aws-access-key"),
            (2, "github-token"),
            (3, "private-key"),
            (4, "password-literal"),
            (5, "slack-token")
        ]
    );
    let shown: Vec<String> = findings.iter().map(ToString::to_string).collect();
    assert_eq!(
        shown[0],
        "s.py:1:8: [aws-access-key] an AWS access key id (20 characters, redacted)"
    );
    for secret in [&key, &token, "hunter2hunter2"] {
        assert!(!shown.join("\n").contains(secret), "{shown:?}");
        assert!(values.iter().any(|v| v.contains(secret)));
    }
}

#[test]
fn a_secret_built_from_pieces_is_found_where_it_is_built_and_never_printed() {
    let key = "AKIA".to_owned() + "IOSFODNN7EXAMPLQ";
    let answer = serde_json::json!({ "strings": [
        { "file": "s.py", "line": 3, "col": 7, "text": format!("KEY = \"{key}\""), "value": key },
        {
            "file": "s.py", "line": 5, "col": 12, "text": "password = \"hunter2hunter2\"",
            "value": "hunter2hunter2"
        },
        { "file": "s.py", "line": 6, "col": 1, "text": "word_count", "value": "word_count" },
    ], "unscanned": [{ "file": "t.py", "reason": "too deeply nested" }] });
    let (findings, values) = shipped().scan_built(answer.to_string().as_bytes()).unwrap();
    let shown: Vec<String> = findings.iter().map(ToString::to_string).collect();
    // A file whose strings could not be followed fails the scan first, where it stands.
    assert_eq!(
        shown,
        [
            "t.py:1: [unscanned] the strings it builds cannot be followed (too deeply nested), \
                 so it cannot be checked for secrets",
            "s.py:3:7: [aws-access-key] an AWS access key id (20 characters, redacted), built \
                 from pieces",
            "s.py:5:12: [password-literal] a password written into the code (27 characters, \
                 redacted), built from pieces"
        ]
    );
    // What is redacted elsewhere is the string as the program builds it.
    assert_eq!(values, [key, "hunter2hunter2".to_owned()]);
    // The question kavi asks names only Python files.
    let files = [
        SkillFile {
            name: "skills/a/skill.py".into(),
            text: "x = 1\n".into(),
        },
        SkillFile {
            name: "skills/a/README.md".into(),
            text: "AKIA\n".into(),
        },
    ];
    let request = Scanner::strings_request(&files);
    assert_eq!(request["strings"], true);
    assert_eq!(request["files"].as_array().unwrap().len(), 1);
    assert!(shipped().scan_built(b"{\"findings\": []}").is_err());
    // An answer that does not say what it could not follow is not one kavi reads as clean.
    assert!(shipped().scan_built(b"{\"strings\": []}").is_err());
}

#[test]
fn a_policy_naming_what_it_does_not_declare_is_pointed_at() {
    let cases = [
        (
            "[class.READ_ONLY]\nforbid = [\"teleport\"]\n",
            "unknown capability `teleport`",
            "s.toml:2:11",
        ),
        (
            "[class.ROOT]\nforbid = []\n",
            "unknown side-effect class `ROOT`",
            "s.toml:1:1",
        ),
        (
            "default_class = \"NETWORK\"\n",
            "default_class `NETWORK` is not a class declared here",
            "s.toml:1:17",
        ),
        (
            "test_files = [\"[\"]\n",
            "invalid glob in test_files",
            "s.toml:1:15",
        ),
        (
            "[[secret]]\nid = \"x\"\nmessage = \"m\"\nregex = '('\n",
            "invalid regular expression in rule `x`",
            "s.toml:4:9",
        ),
    ];
    for (text, message, position) in cases {
        let err = Scanner::parse(&SourceFile::new("s.toml", text)).unwrap_err();
        assert!(err.message.starts_with(message), "{}", err.message);
        assert_eq!(err.position().as_deref(), Some(position), "{text}");
    }
}

#[test]
fn a_skill_folder_is_read_whole_and_what_cannot_be_read_as_python_is_a_finding() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("skills/a");
    std::fs::create_dir_all(folder.join("__pycache__")).unwrap();
    std::fs::write(folder.join("skill.py"), "x = 1\n").unwrap();
    std::fs::write(folder.join("helpers.py"), b"\xff\xfe").unwrap();
    std::fs::write(folder.join("__pycache__/helpers.cpython-311.pyc"), b"\0").unwrap();
    std::fs::write(folder.join("native.so"), b"\0").unwrap();
    std::os::unix::fs::symlink("/etc/passwd", folder.join("README.md")).unwrap();
    let (files, findings) = read_skill_files(dir.path(), &["skills/a".into()]).unwrap();
    let names: Vec<&str> = files.iter().map(|f| f.name.as_str()).collect();
    assert_eq!(names, ["skills/a/helpers.py", "skills/a/skill.py"]);
    let found: Vec<(&str, &str)> = findings
        .iter()
        .map(|f| (f.file.as_str(), f.rule.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("skills/a/README.md", "not-a-file"),
            (
                "skills/a/__pycache__/helpers.cpython-311.pyc",
                "compiled-code"
            ),
            ("skills/a/helpers.py", "encoding"),
            ("skills/a/native.so", "compiled-code"),
        ]
    );
    let (request, _) = shipped()
        .analyser_request(Some("READ_ONLY"), &files)
        .unwrap();
    assert_eq!(request["files"].as_array().unwrap().len(), 2);
    assert_eq!(request["files"][1]["module"], "skill");
    assert_eq!(request["files"][1]["test"], false);
    assert!(Scanner::analyser_findings(b"{\"findings\": 3}").is_err());
    assert!(Scanner::analyser_findings(b"").is_err());
}

#[test]
fn a_bad_expression_points_at_its_rule() {
    let source = SourceFile::new(
        "s.toml",
        "[[rule]]\nid = \"x\"\nmessage = \"m\"\nregex = '(unclosed'\n",
    );
    let err = Scanner::parse(&source).unwrap_err();
    assert!(
        err.message
            .starts_with("invalid regular expression in rule `x`"),
        "{}",
        err.message
    );
    assert_eq!(err.position().as_deref(), Some("s.toml:4:9"));
}

#[test]
fn a_fifo_in_place_of_a_scanned_file_is_refused_not_waited_on() {
    let dir = tempfile::tempdir().unwrap();
    nix::unistd::mkfifo(&dir.path().join("skill.py"), nix::sys::stat::Mode::S_IRWXU).unwrap();
    // Opened to read as a file is, a FIFO waits for a writer: this call would not return.
    let error = read_skill_files(dir.path(), &["skill.py".into()]).unwrap_err();
    assert!(
        error.starts_with("cannot read skill.py:") && error.ends_with("no longer a regular file"),
        "{error}"
    );
}
