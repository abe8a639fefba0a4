-- 20: the content of small artifacts, kept in the ledger instead of files (an artifact row
-- with an empty path). Not journaled: the journaled artifact row names it by its SHA-256,
-- and `ledger verify` re-hashes it.

    CREATE TABLE artifact_contents (
        sha256  TEXT PRIMARY KEY REFERENCES artifacts(sha256),
        content BLOB NOT NULL
    );
