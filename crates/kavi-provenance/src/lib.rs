//! Provenance a third party can check without kavi: each promotion's in-toto Statement (v1),
//! whose predicate is a SLSA Provenance (v1), in a DSSE envelope signed with kavi's ed25519
//! signing key (`kavi ledger keygen`, kept outside every workspace).
//!
//! The statement's subjects are the promoted files (the proposal and the skill's folder) with
//! their SHA-256. The predicate says how they came to be trusted, from the ledger's records:
//! the proposal and the pipeline run that promoted them (external parameters), the governing
//! set that run was under and the gate toolchains (resolved dependencies), the builder (its
//! command and confinement policy), and the gate results, build attempts and lifecycle moves
//! with their actors (byproducts). What a verifier can and cannot conclude: docs/provenance.md.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ed25519_dalek::{Signature, Signer as _, SigningKey, VerifyingKey};
use serde_json::{Value, json};

use kavi_ledger::{Ledger, LedgerError, PromotionRow};

pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
pub const PREDICATE_TYPE: &str = "https://slsa.dev/provenance/v1";
/// DSSE's payload type for an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
/// The build type: a kavi forge, propose → build → verify → promote.
pub const BUILD_TYPE: &str = "https://kavi.dev/forge/v1";
/// The builder: kavi's forge, whose builder command and confinement the predicate names.
pub const BUILDER_ID: &str = "https://kavi.dev/forge/builder/v1";

#[derive(Debug, thiserror::Error)]
pub enum ProvenanceError {
    #[error(transparent)]
    Ledger(#[from] LedgerError),
    #[error("the attestation is not a DSSE envelope kavi can read: {0}")]
    Malformed(String),
    #[error("no signature in the attestation verifies under key {0}…")]
    Signature(String),
    #[error("the attestation's statement is not what kavi attests: {0}")]
    Statement(String),
}

type Result<T, E = ProvenanceError> = std::result::Result<T, E>;

/// A file a promotion vouched for: its path in the workspace, its bytes, and whether it is
/// executable (the one mode bit that travels, as in git: the rest is the reader's umask's).
pub struct Subject<'a> {
    pub name: String,
    pub bytes: &'a [u8],
    pub executable: bool,
}

/// The hex SHA-256 of `bytes`.
fn sha256_hex(bytes: &[u8]) -> String {
    use sha2::Digest as _;
    format!("{:x}", sha2::Sha256::digest(bytes))
}

/// `sha256:<hex>`, as the ledger writes hashes, as a resource descriptor's digest.
fn digest(hash: &str) -> Value {
    json!({ "sha256": hash.strip_prefix("sha256:").unwrap_or(hash) })
}

/// The statement of `promotion`, whose files are `subjects`, from the ledger's records.
pub fn statement(
    ledger: &Ledger,
    promotion: &PromotionRow,
    subjects: &[Subject<'_>],
) -> Result<Value> {
    let run = promotion.run_id.map(|id| ledger.run(id)).transpose()?;
    let governing = match &run {
        Some(run) => ledger.governing(run.id)?,
        None => Vec::new(),
    };
    let gates: Vec<_> = match &run {
        Some(run) => ledger
            .verifications(run.id)?
            .into_iter()
            .filter(|v| {
                v.skill.as_deref() == Some(&promotion.skill)
                    && v.source_hash.as_deref() == Some(&promotion.source_hash)
            })
            .collect(),
        None => Vec::new(),
    };
    let mut resolved: Vec<Value> = governing
        .iter()
        .map(|member| {
            json!({
                "uri": member.path,
                "digest": digest(&member.spec_hash),
                "annotations": { "role": member.role },
            })
        })
        .collect();
    for tool in gates.iter().filter_map(|gate| gate.result.tool.as_ref()) {
        let (Some(name), Some(hash)) = (tool["toolchain"].as_str(), tool["hash"].as_str()) else {
            continue;
        };
        let entry = json!({
            "name": format!("toolchain:{name}"),
            "digest": digest(hash),
            "annotations": { "lock": tool["lock"] },
        });
        if !resolved.contains(&entry) {
            resolved.push(entry);
        }
    }
    let built = match &run {
        Some(run) => ledger
            .builds(&promotion.skill)?
            .into_iter()
            .filter(|b| b.run_id == Some(run.id))
            .collect(),
        None => Vec::new(),
    };
    // A promotion whose run built nothing (an import) names no builder.
    let builder_command = (!built.is_empty())
        .then_some(&governing)
        .into_iter()
        .flatten()
        .find(|member| member.path == "kavi.toml")
        .and_then(|member| ledger.spec_text(&member.spec_hash).ok())
        .and_then(|(_, text)| text.parse::<toml::Table>().ok())
        .and_then(|table| table.get("builder")?.as_str().map(str::to_owned));
    let confinement = governing
        .iter()
        .find(|member| member.path.ends_with("confinement.toml"))
        .map(|member| json!({ "uri": member.path, "digest": digest(&member.spec_hash) }));
    let mut byproducts: Vec<Value> = gates
        .iter()
        .map(|gate| {
            let mut entry = json!({
                "name": format!("gate:{}", gate.result.gate),
                "annotations": {
                    "kind": gate.result.kind,
                    "required": gate.result.required,
                    "status": gate.result.status,
                    "failure_kind": gate.result.failure_kind,
                    "tool": gate.result.tool,
                    "node": gate.node_id,
                    "at": gate.at,
                },
            });
            if let Some(report) = &gate.report {
                entry["digest"] = digest(report);
            }
            entry
        })
        .collect();
    {
        for build in built {
            let mut entry = json!({
                "name": format!("build:{}", build.attempt),
                "annotations": {
                    "status": build.status,
                    "failure_kind": build.failure_kind,
                    "exit_code": build.exit_code,
                    "packet": build.packet,
                },
            });
            if let Some(log) = &build.log {
                entry["digest"] = digest(log);
            }
            byproducts.push(entry);
        }
    }
    // The moves of this version, from its proposal up to and with the promotion: who
    // proposed, who approved.
    for moved in ledger
        .skill_transitions(&promotion.skill)?
        .into_iter()
        .filter(|t| {
            promotion
                .version_proposed_at
                .as_ref()
                .is_none_or(|proposed| t.at >= *proposed)
                && t.at <= promotion.at
        })
    {
        byproducts.push(json!({
            "name": format!(
                "transition:{}->{}",
                moved.from_state.as_deref().unwrap_or("(proposed)"),
                moved.to_state
            ),
            "annotations": {
                "actor": moved.actor,
                "at": moved.at,
                "comment": moved.comment,
                "run": moved.run_id,
            },
        }));
    }
    let ledger_id = ledger.identity()?.unwrap_or_default();
    let mut metadata = json!({ "finishedOn": promotion.at });
    if let Some(run) = &run {
        metadata["invocationId"] = json!(format!("kavi:ledger/{ledger_id}/run/{}", run.id));
        metadata["startedOn"] = json!(run.started_at);
    }
    Ok(json!({
        "_type": STATEMENT_TYPE,
        "subject": subjects
            .iter()
            .map(|s| {
                let mut subject =
                    json!({ "name": s.name, "digest": { "sha256": sha256_hex(s.bytes) } });
                if s.executable {
                    subject["annotations"] = json!({ "executable": true });
                }
                subject
            })
            .collect::<Vec<_>>(),
        "predicateType": PREDICATE_TYPE,
        "predicate": {
            "buildDefinition": {
                "buildType": BUILD_TYPE,
                "externalParameters": {
                    "skill": promotion.skill,
                    "version": promotion.version,
                    "sourceHash": promotion.source_hash,
                    "pipeline": run.as_ref().map(|r| &r.spec_path),
                    "params": run.as_ref().map(|r| &r.params),
                },
                "internalParameters": {
                    "builder": builder_command,
                    "confinement": confinement,
                    "promotedBy": promotion.actor,
                    "runStartedBy": run.as_ref().and_then(|r| r.started_by.as_ref()),
                    "governingHash": run.as_ref().and_then(|r| r.governing_hash.as_ref()),
                },
                "resolvedDependencies": resolved,
            },
            "runDetails": {
                "builder": {
                    "id": BUILDER_ID,
                    "version": { "kavi": env!("CARGO_PKG_VERSION") },
                },
                "metadata": metadata,
                "byproducts": byproducts,
            },
        },
    }))
}

/// DSSE's pre-authentication encoding of a payload: what the signature covers.
fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut encoded = format!(
        "DSSEv1 {} {} {} ",
        payload_type.len(),
        payload_type,
        payload.len()
    )
    .into_bytes();
    encoded.extend_from_slice(payload);
    encoded
}

/// The key id kavi signs as: the public key's hex, as `kavi ledger keygen` prints it.
pub fn key_id(key: &VerifyingKey) -> String {
    kavi_ledger::checkpoint::public_hex(key)
}

/// `statement` in a DSSE envelope signed with `key`, as the JSON text kept and handed out.
pub fn envelope(statement: &Value, key: &SigningKey) -> String {
    let payload = serde_json::to_vec(statement).expect("a statement serializes");
    let signature = key.sign(&pae(PAYLOAD_TYPE, &payload));
    let envelope = json!({
        "payloadType": PAYLOAD_TYPE,
        "payload": BASE64.encode(&payload),
        "signatures": [{
            "keyid": key_id(&key.verifying_key()),
            "sig": BASE64.encode(signature.to_bytes()),
        }],
    });
    serde_json::to_string_pretty(&envelope).expect("an envelope serializes")
}

/// The key ids an envelope's signatures name (unverified: which key to try).
pub fn key_ids(envelope: &str) -> Vec<String> {
    serde_json::from_str::<Value>(envelope)
        .ok()
        .and_then(|e| {
            e["signatures"].as_array().map(|signatures| {
                signatures
                    .iter()
                    .filter_map(|s| s["keyid"].as_str().map(str::to_owned))
                    .collect()
            })
        })
        .unwrap_or_default()
}

/// The statement in `envelope` if a signature in it verifies under `key` and it is a statement
/// of what kavi attests (an in-toto v1 statement with a SLSA v1 provenance predicate).
pub fn verify(envelope: &str, key: &VerifyingKey) -> Result<Value> {
    let envelope: Value =
        serde_json::from_str(envelope).map_err(|e| ProvenanceError::Malformed(e.to_string()))?;
    let field = |name: &str| {
        envelope[name]
            .as_str()
            .ok_or_else(|| ProvenanceError::Malformed(format!("no `{name}` text")))
    };
    let payload_type = field("payloadType")?;
    if payload_type != PAYLOAD_TYPE {
        return Err(ProvenanceError::Malformed(format!(
            "its payload type is `{payload_type}`, not `{PAYLOAD_TYPE}`"
        )));
    }
    let payload = BASE64
        .decode(field("payload")?)
        .map_err(|e| ProvenanceError::Malformed(format!("its payload is not base64: {e}")))?;
    let signed = pae(payload_type, &payload);
    let verifies = envelope["signatures"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|signature| BASE64.decode(signature["sig"].as_str()?).ok())
        .filter_map(|bytes| Signature::from_slice(&bytes).ok())
        .any(|signature| !key.is_weak() && key.verify_strict(&signed, &signature).is_ok());
    if !verifies {
        return Err(ProvenanceError::Signature(
            kavi_ledger::checkpoint::short(&key_id(key)).to_owned(),
        ));
    }
    let statement: Value = serde_json::from_slice(&payload)
        .map_err(|e| ProvenanceError::Statement(format!("its payload is not JSON: {e}")))?;
    let well_formed = |subject: &Value| {
        subject["name"]
            .as_str()
            .is_some_and(|name| !name.is_empty())
            && subject["digest"]["sha256"]
                .as_str()
                .is_some_and(|hex| hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    if !statement["subject"]
        .as_array()
        .is_some_and(|subjects| !subjects.is_empty() && subjects.iter().all(well_formed))
    {
        return Err(ProvenanceError::Statement(
            "it has no subjects, or one without a name and a SHA-256 digest".to_owned(),
        ));
    }
    if !statement["predicate"].is_object() {
        return Err(ProvenanceError::Statement("it has no predicate".to_owned()));
    }
    for (field, want) in [("_type", STATEMENT_TYPE), ("predicateType", PREDICATE_TYPE)] {
        if statement[field] != want {
            return Err(ProvenanceError::Statement(format!(
                "`{field}` is {}, not `{want}`",
                statement[field]
            )));
        }
    }
    Ok(statement)
}

/// The subjects of `statement` whose digest `bytes_of` (reading each by name) does not match:
/// what changed since the attestation was made; `Err` names a subject that cannot be read.
pub fn changed_subjects(
    statement: &Value,
    mut bytes_of: impl FnMut(&str) -> std::io::Result<Vec<u8>>,
) -> Result<Vec<String>, String> {
    let mut changed = Vec::new();
    for subject in statement["subject"].as_array().into_iter().flatten() {
        let name = subject["name"].as_str().unwrap_or_default();
        let bytes = bytes_of(name).map_err(|e| format!("{name}: {e}"))?;
        if subject["digest"]["sha256"].as_str() != Some(&sha256_hex(&bytes)) {
            changed.push(name.to_owned());
        }
    }
    Ok(changed)
}

/// Whether `statement` attests the file `name` as executable.
pub fn attested_executable(statement: &Value, name: &str) -> bool {
    statement["subject"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|subject| subject["name"] == name)
        .is_some_and(|subject| subject["annotations"]["executable"] == true)
}

/// When the promotion `statement` attests took place, as the ledger wrote it.
pub fn attested_at(statement: &Value) -> Option<&str> {
    statement["predicate"]["runDetails"]["metadata"]["finishedOn"].as_str()
}

/// What a skill bundle's `format` says.
pub const BUNDLE_FORMAT: &str = "kavi-bundle/v1";

/// A trusted skill as one workspace hands it to another: its files, the attestation of its
/// promotion, and the public key that signed it. Which keys an importing workspace trusts is its
/// own policy's, never the bundle's.
pub struct Bundle {
    pub skill: String,
    /// The signer's public key, hex.
    pub key: String,
    /// The DSSE envelope, as `kavi skill attest` prints it.
    pub attestation: String,
    /// Each file by its workspace path, in the statement's order.
    pub files: Vec<(String, Vec<u8>)>,
}

impl Bundle {
    /// The bundle as the JSON text `kavi skill export` writes.
    pub fn to_json(&self) -> String {
        let attestation: Value =
            serde_json::from_str(&self.attestation).expect("an envelope kavi made is JSON");
        serde_json::to_string_pretty(&json!({
            "format": BUNDLE_FORMAT,
            "skill": self.skill,
            "key": self.key,
            "attestation": attestation,
            "files": self.files.iter().map(|(path, bytes)| json!({
                "path": path,
                "content": BASE64.encode(bytes),
            })).collect::<Vec<_>>(),
        }))
        .expect("a bundle serializes")
    }

    /// Reads a bundle's JSON text; its contents are checked by [`Bundle::check`].
    pub fn from_json(text: &str) -> Result<Self> {
        let malformed = |what: &str| ProvenanceError::Malformed(format!("the bundle {what}"));
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ProvenanceError::Malformed(format!("the bundle is not JSON: {e}")))?;
        if value["format"] != BUNDLE_FORMAT {
            return Err(malformed(&format!("is not a {BUNDLE_FORMAT} bundle")));
        }
        let text_of = |field: &str| {
            value[field]
                .as_str()
                .map(str::to_owned)
                .ok_or_else(|| malformed(&format!("has no `{field}` text")))
        };
        let mut files = Vec::new();
        for file in value["files"]
            .as_array()
            .ok_or_else(|| malformed("lists no files"))?
        {
            let path = file["path"]
                .as_str()
                .ok_or_else(|| malformed("names a file with no path"))?;
            let bytes = file["content"]
                .as_str()
                .and_then(|content| BASE64.decode(content).ok())
                .ok_or_else(|| malformed(&format!("holds no base64 content for {path}")))?;
            files.push((path.to_owned(), bytes));
        }
        Ok(Bundle {
            skill: text_of("skill")?,
            key: text_of("key")?,
            attestation: serde_json::to_string(&value["attestation"]).expect("JSON serializes"),
            files,
        })
    }

    /// The bundle's statement, when its attestation verifies under `key` and its files are
    /// exactly the statement's subjects, each with its digest, for the skill it names.
    pub fn check(&self, key: &VerifyingKey) -> Result<Value> {
        let statement = verify(&self.attestation, key)?;
        let attested = statement["predicate"]["buildDefinition"]["externalParameters"]["skill"]
            .as_str()
            .unwrap_or_default();
        if attested != self.skill {
            return Err(ProvenanceError::Statement(format!(
                "it attests skill `{attested}`, and the bundle says `{}`",
                self.skill
            )));
        }
        let subjects: Vec<(&str, &str)> = statement["subject"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|s| {
                (
                    s["name"].as_str().unwrap_or_default(),
                    s["digest"]["sha256"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        let files: Vec<(&str, String)> = self
            .files
            .iter()
            .map(|(path, bytes)| (path.as_str(), sha256_hex(bytes)))
            .collect();
        let mut names: Vec<&str> = subjects.iter().map(|(name, _)| *name).collect();
        names.sort_unstable();
        names.dedup();
        if names.len() != subjects.len() || subjects.is_empty() {
            return Err(ProvenanceError::Statement(
                "it names no file, or one file twice".to_owned(),
            ));
        }
        let same = subjects.len() == files.len()
            && subjects
                .iter()
                .zip(&files)
                .all(|((name, digest), (path, actual))| name == path && digest == actual);
        if !same {
            return Err(ProvenanceError::Statement(
                "the bundle's files are not exactly the attested ones with their digests"
                    .to_owned(),
            ));
        }
        Ok(statement)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SigningKey {
        SigningKey::from_bytes(&[7; 32])
    }

    fn minimal() -> Value {
        json!({
            "_type": STATEMENT_TYPE,
            "subject": [{ "name": "skills/x/skill.py", "digest": { "sha256": sha256_hex(b"x") } }],
            "predicateType": PREDICATE_TYPE,
            "predicate": { "buildDefinition": { "buildType": BUILD_TYPE } },
        })
    }

    #[test]
    fn an_envelope_verifies_under_its_key_and_under_no_other() {
        let text = envelope(&minimal(), &key());
        assert_eq!(verify(&text, &key().verifying_key()).unwrap(), minimal());
        let other = SigningKey::from_bytes(&[8; 32]).verifying_key();
        assert!(matches!(
            verify(&text, &other),
            Err(ProvenanceError::Signature(_))
        ));
    }

    #[test]
    fn a_changed_payload_or_payload_type_does_not_verify() {
        let mut tampered: Value = serde_json::from_str(&envelope(&minimal(), &key())).unwrap();
        let mut statement = minimal();
        statement["subject"][0]["digest"]["sha256"] = json!(sha256_hex(b"y"));
        tampered["payload"] = json!(BASE64.encode(serde_json::to_vec(&statement).unwrap()));
        assert!(matches!(
            verify(&tampered.to_string(), &key().verifying_key()),
            Err(ProvenanceError::Signature(_))
        ));
        let mut retyped: Value = serde_json::from_str(&envelope(&minimal(), &key())).unwrap();
        retyped["payloadType"] = json!("application/json");
        assert!(matches!(
            verify(&retyped.to_string(), &key().verifying_key()),
            Err(ProvenanceError::Malformed(_))
        ));
    }

    /// The encoding DSSE's specification gives as its example.
    #[test]
    fn the_pre_authentication_encoding_is_dsses() {
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
    }

    #[test]
    fn a_bundle_checks_only_with_exactly_its_attested_files() {
        let bundle = Bundle {
            skill: "x".into(),
            key: key_id(&key().verifying_key()),
            attestation: envelope(
                &{
                    let mut s = minimal();
                    s["predicate"]["buildDefinition"]["externalParameters"] = json!({"skill": "x"});
                    s
                },
                &key(),
            ),
            files: vec![("skills/x/skill.py".into(), b"x".to_vec())],
        };
        let read = Bundle::from_json(&bundle.to_json()).unwrap();
        read.check(&key().verifying_key()).unwrap();
        let mut changed = Bundle::from_json(&bundle.to_json()).unwrap();
        changed.files[0].1 = b"y".to_vec();
        assert!(changed.check(&key().verifying_key()).is_err());
        let mut more = Bundle::from_json(&bundle.to_json()).unwrap();
        more.files.push(("skills/x/extra.py".into(), b"z".to_vec()));
        assert!(more.check(&key().verifying_key()).is_err());
        let mut renamed = Bundle::from_json(&bundle.to_json()).unwrap();
        renamed.skill = "y".into();
        assert!(renamed.check(&key().verifying_key()).is_err());
    }

    /// Only a subject annotated executable is: the annotation is inside the signed statement.
    #[test]
    fn the_executable_bit_is_read_from_the_statement() {
        let mut statement = minimal();
        assert!(!attested_executable(&statement, "skills/x/skill.py"));
        statement["subject"][0]["annotations"] = json!({ "executable": true });
        assert!(attested_executable(&statement, "skills/x/skill.py"));
        assert!(!attested_executable(&statement, "skills/x/other.py"));
    }

    #[test]
    fn changed_subjects_are_named() {
        let statement = minimal();
        assert!(
            changed_subjects(&statement, |_| Ok(b"x".to_vec()))
                .unwrap()
                .is_empty()
        );
        assert_eq!(
            changed_subjects(&statement, |_| Ok(b"z".to_vec())).unwrap(),
            ["skills/x/skill.py"]
        );
    }
}
