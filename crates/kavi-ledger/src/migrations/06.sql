-- 6: build attempts, with their lineage.

    CREATE TABLE builds (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        skill        TEXT NOT NULL REFERENCES skills(name),
        attempt      INTEGER NOT NULL,
        parent_build INTEGER REFERENCES builds(id),
        run_id       INTEGER REFERENCES runs(id),
        node_id      TEXT,
        status       TEXT NOT NULL,            -- running | succeeded | failed
        packet       TEXT REFERENCES artifacts(sha256),
        log          TEXT REFERENCES artifacts(sha256),
        exit_code    INTEGER,
        started_at   TEXT NOT NULL,
        finished_at  TEXT,
        UNIQUE (skill, attempt)
    );
