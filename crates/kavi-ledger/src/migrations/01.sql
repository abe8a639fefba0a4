-- 1: runs, node runs, specs, artifacts.

    CREATE TABLE specs (
        hash        TEXT PRIMARY KEY,          -- 'sha256:<hex>' of the text
        path        TEXT NOT NULL,             -- where it was first read from
        text        TEXT NOT NULL,
        created_at  TEXT NOT NULL
    );

    CREATE TABLE artifacts (
        sha256      TEXT PRIMARY KEY,          -- hex digest of the content
        kind        TEXT NOT NULL,             -- STDOUT, STDERR, RENDERED, BUILD_PACKET, ...
        size        INTEGER NOT NULL,
        path        TEXT NOT NULL,             -- relative to the artifact store
        created_at  TEXT NOT NULL
    );

    CREATE TABLE runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        pipeline    TEXT NOT NULL,
        spec_path   TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        params      TEXT NOT NULL,             -- JSON object
        status      TEXT NOT NULL,
        started_at  TEXT NOT NULL,
        finished_at TEXT,
        duration_ms INTEGER,
        parent_run  INTEGER REFERENCES runs(id),
        owner       TEXT NOT NULL,             -- names the lock file held while the run is live
        error       TEXT
    );
    CREATE INDEX runs_status ON runs(status);

    CREATE TABLE node_runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        node_id     TEXT NOT NULL,
        kind        TEXT NOT NULL,
        state       TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        started_at  TEXT,
        finished_at TEXT,
        duration_ms INTEGER,
        exit_code   INTEGER,
        outputs     TEXT,                      -- JSON
        error       TEXT,                      -- why it failed
        reason      TEXT,                      -- why it was skipped, blocked or cancelled
        UNIQUE (run_id, node_id, attempt)
    );
    CREATE INDEX node_runs_run ON node_runs(run_id);

    CREATE TABLE node_run_artifacts (
        node_run_id INTEGER NOT NULL REFERENCES node_runs(id),
        role        TEXT NOT NULL,             -- stdout, stderr, rendered, ...
        sha256      TEXT NOT NULL REFERENCES artifacts(sha256),
        PRIMARY KEY (node_run_id, role)
    );
