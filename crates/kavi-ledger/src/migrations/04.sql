-- 4: one row per gate result.

    CREATE TABLE verifications (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id       INTEGER NOT NULL REFERENCES runs(id),
        node_id      TEXT NOT NULL,
        skill        TEXT,
        gate_id      TEXT NOT NULL,
        gate_kind    TEXT NOT NULL,
        required     INTEGER NOT NULL,
        status       TEXT NOT NULL,            -- passed | failed | error | timed_out
        failure_kind TEXT,                     -- set when not passed
        detail       TEXT,
        report       TEXT REFERENCES artifacts(sha256),
        at           TEXT NOT NULL
    );
    CREATE INDEX verifications_run ON verifications(run_id);
