-- 11: executions of trusted skills (kavi skill run, chains, replay), linked by parent.

    CREATE TABLE executions (
        id          TEXT PRIMARY KEY,
        parent      TEXT REFERENCES executions(id),
        skill       TEXT NOT NULL,
        source_hash TEXT,                      -- the hash the skill was run at (NULL: not reached)
        side_effect TEXT NOT NULL,
        input       TEXT,                      -- JSON
        output      TEXT,                      -- JSON
        success     INTEGER NOT NULL,
        error       TEXT,
        started_at  TEXT NOT NULL,
        finished_at TEXT NOT NULL,
        duration_ms INTEGER NOT NULL,
        chain       TEXT,                      -- the chain and step that ran it, if any
        step        TEXT,
        run_id      INTEGER REFERENCES runs(id)
    );
    CREATE INDEX executions_parent ON executions(parent);
    CREATE INDEX executions_started ON executions(started_at);
