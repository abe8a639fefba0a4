-- 34: the content of file artifacts, on a server ledger, where every machine reads it: in
-- chunks of at most 1 MiB, numbered from 0, written with the artifact's row and read one at a
-- time (an artifact is never held whole). Unused on SQLite, whose machine has the files. Not
-- journaled: the journaled artifact row names it by its SHA-256, and `ledger verify` re-hashes
-- it.

    CREATE TABLE artifact_chunks (
        sha256  TEXT NOT NULL REFERENCES artifacts(sha256),
        seq     INTEGER NOT NULL,
        content BLOB NOT NULL,
        PRIMARY KEY (sha256, seq)
    );
