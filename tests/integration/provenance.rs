//! Provenance a third party can verify: a promotion's attestation, checked by the in-toto and
//! DSSE reference libraries from PyPI (tests/provenance/verify_attestation.py, none of kavi's
//! code) and by `kavi skill verify-attestation`; a tampered file, a tampered predicate and a
//! wrong key refused by both.

use crate::common;

use std::path::Path;
use std::process::Output;

use common::{json, kavi_command, shipped_workspace};

/// kavi in `root` with a keys folder of this test's own, where `kavi ledger keygen` makes the
/// signing key the promotion signs with.
fn kavi(root: &Path, keys: &Path, args: &[&str]) -> Output {
    kavi_command(root, args)
        .env("KAVI_KEYS", keys)
        .output()
        .unwrap()
}

fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `out` is a refusal (exit 2) whose message says `why`.
fn assert_refused(out: &Output, why: &str) {
    assert_eq!(out.status.code(), Some(2), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(why),
        "{out:?}"
    );
}

/// The public key `kavi ledger keygen` printed.
fn public_key(keygen: &Output) -> String {
    let text = stdout(keygen) + &String::from_utf8_lossy(&keygen.stderr);
    text.split_whitespace()
        .find(|word| word.len() == 64 && word.chars().all(|c| c.is_ascii_hexdigit()))
        .unwrap_or_else(|| panic!("no public key in: {text}"))
        .to_owned()
}

/// The reference libraries' verdict on `envelope` under `key` for the files in `workspace`:
/// `Ok` when they verify it, else what they said.
fn reference_verdict(
    python: &Path,
    envelope: &Path,
    key: &str,
    workspace: &Path,
) -> Result<(), String> {
    let out = std::process::Command::new(python)
        .arg(common::repo().join("tests/provenance/verify_attestation.py"))
        .args([envelope, Path::new(key), workspace])
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    match (out.status.success(), said.trim() == "verified") {
        (true, true) => Ok(()),
        (false, _) => Err(said),
        (true, false) => panic!("the verifier exited 0 without saying `verified`: {said}"),
    }
}

#[test]
fn a_promotions_attestation_verifies_with_the_reference_libraries_and_tampering_does_not() {
    let Some(python) = common::python_with(
        "provenance",
        "in-toto-attestation>=0.9,<1' 'securesystemslib[crypto]>=1,<2",
        "in_toto_attestation, securesystemslib.dsse",
    ) else {
        return;
    };
    let ws = shipped_workspace();
    let root = ws.path();
    let keys = tempfile::tempdir().unwrap();
    let keygen = kavi(root, keys.path(), &["ledger", "keygen"]);
    assert!(keygen.status.success(), "{keygen:?}");
    let key = public_key(&keygen);

    let forged = kavi(
        root,
        keys.path(),
        &["pipeline", "run", "forge", "--set", "skill=word_count"],
    );
    assert!(forged.status.success(), "{forged:?}");
    let attested = kavi(root, keys.path(), &["skill", "attest", "word_count"]);
    assert!(attested.status.success(), "{attested:?}");
    let envelope = root.join("attestation.json");
    std::fs::write(&envelope, &attested.stdout).unwrap();
    // Made at the promotion and kept: asking again gives the same envelope.
    let again = kavi(root, keys.path(), &["skill", "attest", "word_count"]);
    assert_eq!(again.stdout, attested.stdout);

    reference_verdict(&python, &envelope, &key, root).unwrap();
    let checked = kavi(
        root,
        keys.path(),
        &[
            "skill",
            "verify-attestation",
            "attestation.json",
            "--key",
            &key,
            "--files",
            ".",
            "--json",
        ],
    );
    assert!(checked.status.success(), "{checked:?}");
    let report = json(&checked);
    let statement = &report["statement"];
    let names: Vec<&str> = statement["subject"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        [
            "proposals/word_count.toml",
            "skills/word_count/skill.py",
            "skills/word_count/test_skill.py"
        ]
    );
    let predicate = &statement["predicate"];
    assert_eq!(
        predicate["buildDefinition"]["externalParameters"]["skill"],
        "word_count"
    );
    assert_eq!(
        predicate["buildDefinition"]["internalParameters"]["builder"],
        "python3 builders/scripted.py"
    );
    let dependencies = predicate["buildDefinition"]["resolvedDependencies"].to_string();
    for member in [
        "policies/gates.toml",
        "policies/confinement.toml",
        "kavi.toml",
    ] {
        assert!(dependencies.contains(member), "{member} in {dependencies}");
    }
    let byproducts = predicate["runDetails"]["byproducts"].to_string();
    for gate in [
        "gate:tests",
        "gate:lint",
        "gate:types",
        "transition:VERIFIED->TRUSTED",
    ] {
        assert!(byproducts.contains(gate), "{gate} in {byproducts}");
    }

    // A wrong key: refused by both.
    let wrong = public_key(&kavi(
        root,
        tempfile::tempdir().unwrap().path(),
        &["ledger", "keygen"],
    ));
    let said = reference_verdict(&python, &envelope, &wrong, root).unwrap_err();
    assert!(said.contains("signature"), "{said}");
    let refused = kavi(
        root,
        keys.path(),
        &[
            "skill",
            "verify-attestation",
            "attestation.json",
            "--key",
            &wrong,
        ],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");

    // A predicate changed after signing (another account named as the promoter): refused.
    let mut tampered: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&envelope).unwrap()).unwrap();
    let mut changed = statement.clone();
    changed["predicate"]["buildDefinition"]["internalParameters"]["promotedBy"] =
        "someone else".into();
    use base64::Engine as _;
    tampered["payload"] = base64::engine::general_purpose::STANDARD
        .encode(changed.to_string())
        .into();
    let forged_envelope = root.join("tampered.json");
    std::fs::write(&forged_envelope, tampered.to_string()).unwrap();
    let said = reference_verdict(&python, &forged_envelope, &key, root).unwrap_err();
    assert!(said.contains("signature"), "{said}");
    let refused = kavi(
        root,
        keys.path(),
        &[
            "skill",
            "verify-attestation",
            "tampered.json",
            "--key",
            &key,
        ],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");

    // A file changed after the attestation: its digest no longer matches, for both.
    let skill = root.join("skills/word_count/skill.py");
    let mut text = std::fs::read_to_string(&skill).unwrap();
    text.push_str("\n# changed after promotion\n");
    std::fs::write(&skill, text).unwrap();
    let said = reference_verdict(&python, &envelope, &key, root).unwrap_err();
    assert!(said.contains("skills/word_count/skill.py"), "{said}");
    let refused = kavi(
        root,
        keys.path(),
        &[
            "skill",
            "verify-attestation",
            "attestation.json",
            "--key",
            &key,
            "--files",
            ".",
        ],
    );
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    assert!(
        stdout(&refused).contains("changed since attested: skills/word_count/skill.py"),
        "{refused:?}"
    );
}

/// Without a signing key the promotion stands, says it is not attested, and `kavi skill attest`
/// attests it once a key is made.
#[test]
fn a_promotion_without_a_signing_key_is_attested_once_a_key_is_made() {
    let ws = shipped_workspace();
    let root = ws.path();
    let keys = tempfile::tempdir().unwrap();
    let forged = kavi(
        root,
        keys.path(),
        &["pipeline", "run", "forge", "--set", "skill=word_count"],
    );
    assert!(forged.status.success(), "{forged:?}");
    let refused = kavi(root, keys.path(), &["skill", "attest", "word_count"]);
    assert_refused(&refused, "no signing key");

    let key = public_key(&kavi(root, keys.path(), &["ledger", "keygen"]));
    let attested = kavi(
        root,
        keys.path(),
        &["skill", "attest", "word_count", "-o", "a.json"],
    );
    assert!(attested.status.success(), "{attested:?}");
    let checked = kavi(
        root,
        keys.path(),
        &[
            "skill",
            "verify-attestation",
            "a.json",
            "--key",
            &key,
            "--files",
            ".",
        ],
    );
    assert!(checked.status.success(), "{checked:?}");
    assert!(stdout(&checked).contains("all 3 match"), "{checked:?}");
    // The private key's file, given for the public one, is refused by name and never echoed.
    let private = keys.path().join("signing.key");
    let seed = std::fs::read_to_string(&private).unwrap();
    let refused = kavi(
        root,
        keys.path(),
        &[
            "skill",
            "verify-attestation",
            "a.json",
            "--key",
            private.to_str().unwrap(),
        ],
    );
    assert_eq!(refused.status.code(), Some(2), "{refused:?}");
    let said = format!("{refused:?}");
    assert!(said.contains("private signing key"), "{said}");
    assert!(!said.contains(seed.trim()), "{said}");

    let missing = kavi(root, keys.path(), &["skill", "attest", "nosuch"]);
    assert_eq!(missing.status.code(), Some(5), "{missing:?}");
}

/// The trust policy of `root` with `key` among the keys whose bundles it accepts, and the import
/// pipeline among those that may promote: a rule change, made before the first run adopts the
/// rules.
fn trust_imports_from(root: &Path, key: &str) {
    let path = root.join("policies/trust.toml");
    let text = std::fs::read_to_string(&path).unwrap().replace(
        r#"pipelines = ["pipelines/forge.toml", "pipelines/forge_attempt.toml"]"#,
        r#"pipelines = ["pipelines/forge.toml", "pipelines/forge_attempt.toml", "pipelines/import.toml"]"#,
    );
    std::fs::write(&path, format!("{text}\n[import]\nkeys = [\"{key}\"]\n")).unwrap();
}

/// A skill forged in one workspace, exported, and imported in another with a key of its own:
/// refused while the importer does not trust the exporter's key; verified by the importer's
/// gates, promoted by its import pipeline and run once it does; a bundle whose file was changed
/// is refused, writing nothing.
#[test]
fn a_skill_bundle_moves_trust_only_to_a_workspace_that_trusts_its_signer() {
    let (a, b) = (shipped_workspace(), shipped_workspace());
    let (keys_a, keys_b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let key_a = public_key(&kavi(a.path(), keys_a.path(), &["ledger", "keygen"]));
    let forged = kavi(
        a.path(),
        keys_a.path(),
        &["pipeline", "run", "forge", "--set", "skill=word_count"],
    );
    assert!(forged.status.success(), "{forged:?}");
    let bundle = b.path().join("word_count.bundle.json");
    let exported = kavi(
        a.path(),
        keys_a.path(),
        &[
            "skill",
            "export",
            "word_count",
            "-o",
            bundle.to_str().unwrap(),
        ],
    );
    assert!(exported.status.success(), "{exported:?}");

    // B never had the skill's folder; its proposal is the shipped one, byte for byte.
    let import = |root: &Path| {
        kavi(
            root,
            keys_b.path(),
            &["skill", "import", "word_count.bundle.json"],
        )
    };
    let refused = import(b.path());
    assert_refused(&refused, "[import] keys does not list");
    assert!(!b.path().join("skills/word_count").exists());

    trust_imports_from(b.path(), &key_a);
    // A file changed in the bundle: its digest is not the attested one.
    let mut tampered: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    use base64::Engine as _;
    tampered["files"][1]["content"] = base64::engine::general_purpose::STANDARD
        .encode("print('{\"words\": 0}')\n")
        .into();
    let changed = b.path().join("changed.bundle.json");
    std::fs::write(&changed, tampered.to_string()).unwrap();
    let refused = kavi(
        b.path(),
        keys_b.path(),
        &["skill", "import", "changed.bundle.json"],
    );
    assert_refused(&refused, "not exactly the attested ones");
    assert!(!b.path().join("skills/word_count").exists());

    // A link on the way to the skill's folder, and a file of B's own in it: refused, nothing
    // written through the link.
    let outside = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(b.path().join("skills")).unwrap();
    std::os::unix::fs::symlink(outside.path(), b.path().join("skills/word_count")).unwrap();
    let refused = import(b.path());
    assert_refused(&refused, "a symlink lies on the way");
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 0);
    std::fs::remove_file(b.path().join("skills/word_count")).unwrap();
    std::fs::create_dir_all(b.path().join("skills/word_count")).unwrap();
    std::fs::write(b.path().join("skills/word_count/helper.py"), "X = 1\n").unwrap();
    let refused = import(b.path());
    assert_refused(&refused, "helper.py` is here and not in the bundle");
    std::fs::remove_file(b.path().join("skills/word_count/helper.py")).unwrap();

    // A predicate changed after signing (the promoter renamed): the signature no longer holds.
    let mut retold: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    let payload = base64::engine::general_purpose::STANDARD
        .decode(retold["attestation"]["payload"].as_str().unwrap())
        .unwrap();
    let mut statement: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    statement["predicate"]["buildDefinition"]["internalParameters"]["promotedBy"] =
        "someone else".into();
    retold["attestation"]["payload"] = base64::engine::general_purpose::STANDARD
        .encode(statement.to_string())
        .into();
    std::fs::write(b.path().join("retold.bundle.json"), retold.to_string()).unwrap();
    let refused = kavi(
        b.path(),
        keys_b.path(),
        &["skill", "import", "retold.bundle.json"],
    );
    assert_refused(&refused, "no signature");
    assert!(!b.path().join("skills/word_count/skill.py").exists());

    let imported = import(b.path());
    assert!(imported.status.success(), "{imported:?}");
    let shown = json(&kavi(
        b.path(),
        keys_b.path(),
        &["skill", "show", "word_count", "--json"],
    ));
    assert_eq!(shown["skill"]["state"], "TRUSTED", "{shown}");
    let moves = shown.to_string();
    assert!(moves.contains("imported: bundle "), "{moves}");
    assert!(moves.contains(&key_a[..16]), "{moves}");
    let ran = kavi(
        b.path(),
        keys_b.path(),
        &[
            "skill",
            "run",
            "word_count",
            "--input",
            r#"{"text": "one two three"}"#,
        ],
    );
    assert!(ran.status.success(), "{ran:?}");
    assert_eq!(json(&ran)["output"]["words"], 3);

    // B's rules are adopted now: a key added to its trust policy on disk is a rule change that
    // no one reviewed, and no bundle it signed is taken in on its word.
    let keys_c = tempfile::tempdir().unwrap();
    let key_c = public_key(&kavi(a.path(), keys_c.path(), &["ledger", "keygen"]));
    let path = b.path().join("policies/trust.toml");
    let text = std::fs::read_to_string(&path).unwrap();
    std::fs::write(
        &path,
        text.replace(&key_a, &format!("{key_a}\", \"{key_c}")),
    )
    .unwrap();
    let mut resigned: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&bundle).unwrap()).unwrap();
    resigned["key"] = key_c.clone().into();
    std::fs::write(b.path().join("resigned.bundle.json"), resigned.to_string()).unwrap();
    let refused = kavi(
        b.path(),
        keys_b.path(),
        &["skill", "import", "resigned.bundle.json"],
    );
    assert_refused(&refused, "are not the adopted rule set");
}

/// The import pipeline takes nothing but a kept bundle's files: run directly, with files of the
/// workspace's own, it stops before BUILT, whatever it is told the bundle was.
#[test]
fn the_import_pipeline_promotes_no_files_but_a_bundles() {
    let (a, c) = (shipped_workspace(), shipped_workspace());
    let keys = tempfile::tempdir().unwrap();
    let key = public_key(&kavi(a.path(), keys.path(), &["ledger", "keygen"]));
    let forged = kavi(
        a.path(),
        keys.path(),
        &["pipeline", "run", "forge", "--set", "skill=word_count"],
    );
    assert!(forged.status.success(), "{forged:?}");
    trust_imports_from(c.path(), &key);
    common::copy_dir(
        &a.path().join("skills/word_count"),
        &c.path().join("skills/word_count"),
    );
    let fake = "0".repeat(64);
    let ran = kavi(
        c.path(),
        keys.path(),
        &[
            "pipeline",
            "run",
            "import",
            "--set",
            "skill=word_count",
            "--set",
            &format!("bundle={fake}"),
        ],
    );
    assert_eq!(ran.status.code(), Some(1), "{ran:?}");
    let shown = json(&kavi(
        c.path(),
        keys.path(),
        &["skill", "show", "word_count", "--json"],
    ));
    assert_eq!(shown["skill"]["state"], "PROPOSED", "{shown}");
}

/// `word_count` forged in a first workspace with a key of its own, exported as
/// `word_count.bundle.json` into a second workspace that trusts that key for imports.
fn exported_to_a_trusting_workspace() -> (tempfile::TempDir, tempfile::TempDir, tempfile::TempDir) {
    let (a, b) = (shipped_workspace(), shipped_workspace());
    let keys = tempfile::tempdir().unwrap();
    let key = public_key(&kavi(a.path(), keys.path(), &["ledger", "keygen"]));
    let forged = kavi(
        a.path(),
        keys.path(),
        &["pipeline", "run", "forge", "--set", "skill=word_count"],
    );
    assert!(forged.status.success(), "{forged:?}");
    let bundle = b.path().join("word_count.bundle.json");
    let export = kavi(
        a.path(),
        keys.path(),
        &[
            "skill",
            "export",
            "word_count",
            "-o",
            bundle.to_str().unwrap(),
        ],
    );
    assert!(export.status.success(), "{export:?}");
    trust_imports_from(b.path(), &key);
    (a, b, keys)
}

/// A bundle its trusted signer re-signed with a file no build may bring in (`conftest.py`, which
/// configures the tests gate): the import pipeline refuses it by the allowlist a build's files
/// pass, and every file the import wrote goes back out, so that the next forge does not find it
/// in the skill's folder as the workspace's own.
#[test]
fn an_import_refused_by_the_allowlist_takes_its_files_back_out() {
    use base64::Engine as _;
    use sha2::Digest as _;
    let base64 = base64::engine::general_purpose::STANDARD;
    let (_a, b, keys) = exported_to_a_trusting_workspace();
    let exported = b.path().join("word_count.bundle.json");

    let mut bundle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&exported).unwrap()).unwrap();
    let payload = base64
        .decode(bundle["attestation"]["payload"].as_str().unwrap())
        .unwrap();
    let mut statement: serde_json::Value = serde_json::from_slice(&payload).unwrap();
    let conftest = b"def pytest_collection_modifyitems(items):\n    items.clear()\n";
    let path = "skills/word_count/conftest.py";
    statement["subject"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({
            "name": path,
            "digest": { "sha256": format!("{:x}", sha2::Sha256::digest(conftest)) },
        }));
    bundle["files"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({ "path": path, "content": base64.encode(conftest) }));
    let signing = kavi_ledger::checkpoint::load(&keys.path().join("signing.key")).unwrap();
    let envelope = kavi_provenance::envelope(&statement, &signing);
    bundle["attestation"] = serde_json::from_str(&envelope).unwrap();
    std::fs::write(b.path().join("resigned.bundle.json"), bundle.to_string()).unwrap();

    let imported = kavi(
        b.path(),
        keys.path(),
        &["skill", "import", "resigned.bundle.json"],
    );
    assert_eq!(imported.status.code(), Some(1), "{imported:?}");
    let said = format!("{imported:?}");
    assert!(
        said.contains("conftest.py` configures a gate's tool"),
        "{said}"
    );
    assert!(said.contains("file(s) it wrote are removed"), "{said}");
    for file in ["conftest.py", "skill.py", "test_skill.py"] {
        let left = b.path().join("skills/word_count").join(file);
        assert!(!left.exists(), "{} is left behind", left.display());
    }
}

/// An import killed after writing a bundle's files, before its pipeline decided on them: the
/// next run takes the files back out (they were listed in kavi's state folder before the first
/// was written), so the next forge does not find them in the skill's folder as the workspace's own.
#[test]
fn a_killed_import_leaves_no_file_for_the_next_run() {
    let (_a, b, keys) = exported_to_a_trusting_workspace();

    let skill = b.path().join("skills/word_count/skill.py");
    let list = b.path().join(".kavi/imports/word_count.json");
    let mut importing = kavi_command(b.path(), &["skill", "import", "word_count.bundle.json"])
        .env("KAVI_KEYS", keys.path())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Killed once the files are written, while its gates run (they take seconds).
    let written = (0..600).any(|_| {
        std::thread::sleep(std::time::Duration::from_millis(50));
        skill.exists() && list.exists()
    });
    importing.kill().unwrap(); // SIGKILL: no chance to take them back out
    importing.wait().unwrap();
    assert!(written, "the import never wrote its files");
    assert!(skill.exists() && list.exists());
    // A list naming files outside the workspace, or reached through a link, is kavi's own
    // only in name: what it names is checked again, and nothing there is removed.
    let outside = tempfile::tempdir().unwrap();
    let victim = outside.path().join("victim.txt");
    std::fs::write(&victim, "keep me").unwrap();
    std::os::unix::fs::symlink(outside.path(), b.path().join("skills/linked")).unwrap();
    let hash = kavi_foundation::hash::sha256_hex(b"keep me");
    let planted = serde_json::json!({"skill": "nosuch", "files": [
        {"path": victim, "sha256": hash},
        {"path": b.path().join("skills/linked/victim.txt"), "sha256": hash},
        {"path": b.path().join("skills/../../victim.txt"), "sha256": hash},
    ]});
    std::fs::write(
        b.path().join(".kavi/imports/nosuch.json"),
        planted.to_string(),
    )
    .unwrap();

    let next = kavi(b.path(), keys.path(), &["pipeline", "run", "diamond"]);
    assert!(next.status.success(), "{next:?}");
    let said = String::from_utf8_lossy(&next.stderr);
    assert!(
        said.contains("written by an import that stopped before its skill was promoted"),
        "{said}"
    );
    for file in ["skill.py", "test_skill.py"] {
        let left = b.path().join("skills/word_count").join(file);
        assert!(!left.exists(), "{} is left behind", left.display());
    }
    assert!(!list.exists());
    assert!(victim.exists(), "a file outside the workspace was removed");
}
