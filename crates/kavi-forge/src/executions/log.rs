//! The JSONL log of executions: one record a line, appended with `O_APPEND` in a single write
//! and fsynced, so concurrent writers never interleave inside a line and a crash loses at most
//! the line being written. The reader skips lines it cannot parse and counts them, so one torn
//! or hand-edited line never hides the rest.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use crate::ledger::ExecutionRecord;

/// Appends one record as one line.
pub fn append(path: &Path, record: &ExecutionRecord) -> std::io::Result<()> {
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::create_dir_all(parent)?;
    }
    let mut line = serde_json::to_vec(record).expect("a record serializes");
    line.push(b'\n');
    // Every run's input and output, as in the ledger: closed to the accounts that may not write
    // the folder as the ledger is (one an older kavi made readable is closed too).
    let mut file = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o666 & !kavi_foundation::sandbox::closed_bits(path))
        .open(path)?;
    kavi_foundation::sandbox::close_to_readers(path)?;
    file.write_all(&line)?;
    file.sync_all()
}

/// What reading the log found.
#[derive(Debug, Default)]
pub struct LogContents {
    /// In the order they were written.
    pub records: Vec<ExecutionRecord>,
    /// Lines that were not a record (torn, edited, not UTF-8).
    pub skipped: usize,
}

/// Reads every record; a missing log is an empty one.
pub fn read(path: &Path) -> std::io::Result<LogContents> {
    let bytes = match std::fs::read(path) {
        Ok(bytes) => bytes,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(LogContents::default()),
        Err(e) => return Err(e),
    };
    let mut contents = LogContents::default();
    for line in bytes.split(|b| *b == b'\n') {
        if line.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<ExecutionRecord>(line) {
            Ok(record) => contents.records.push(record),
            Err(_) => contents.skipped += 1,
        }
    }
    Ok(contents)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(id: &str) -> ExecutionRecord {
        ExecutionRecord {
            execution_id: id.into(),
            parent_execution_id: None,
            skill: "word_count".into(),
            source_hash: Some("sha256:ab".into()),
            skill_version: Some(1),
            side_effect: "READ_ONLY".into(),
            input: Some(serde_json::json!({"text": "a"})),
            output: Some(serde_json::json!({"words": 1})),
            success: true,
            error: None,
            started_at: "2026-01-01T00:00:00Z".into(),
            finished_at: "2026-01-01T00:00:01Z".into(),
            duration_ms: 1000,
            chain: None,
            step: None,
            run_id: None,
            confinement: None,
            caller: None,
        }
    }

    /// The log holds every run's input and output: only the accounts that may write its folder
    /// read it, as the ledger; one an older kavi left readable is closed at the next append.
    #[test]
    fn the_log_is_closed_to_accounts_that_may_not_write_its_folder() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = dir.path().join("executions.jsonl");
        append(&path, &record("a")).unwrap();
        assert_eq!(mode(&path), 0o600);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        append(&path, &record("b")).unwrap();
        assert_eq!(mode(&path), 0o600);
    }

    #[test]
    fn a_malformed_line_in_the_middle_is_skipped_and_counted() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("logs/executions.jsonl");
        append(&path, &record("a")).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .unwrap()
            .write_all(b"{\"execution_id\": \"torn\n\xff\xfe not json\n")
            .unwrap();
        append(&path, &record("b")).unwrap();
        let contents = read(&path).unwrap();
        let ids: Vec<&str> = contents
            .records
            .iter()
            .map(|r| r.execution_id.as_str())
            .collect();
        assert_eq!(ids, ["a", "b"]);
        assert_eq!(contents.skipped, 2);
        assert_eq!(contents.records[1], record("b"));
    }

    #[test]
    fn a_missing_log_is_empty() {
        let contents = read(Path::new("/nonexistent/kavi/executions.jsonl")).unwrap();
        assert!(contents.records.is_empty());
        assert_eq!(contents.skipped, 0);
    }
}
