-- 29: rule sets: the governing files as adopted, and changes proposed to them (see
-- ledger/rules.rs). Exactly one is `adopted` once the first run adopted its set.

    CREATE TABLE rule_sets (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        set_hash    TEXT NOT NULL,             -- set hash over (path, spec hash) of every file
        files       TEXT NOT NULL,             -- JSON object: path -> spec hash (texts in specs)
        status      TEXT NOT NULL,             -- pending | adopted | superseded | rejected
        class       TEXT NOT NULL,             -- first-use | weakening | strengthening | neutral
        changes     TEXT NOT NULL,             -- JSON array of {change, class}
        based_on    INTEGER,                   -- the adopted set it changes
        proposed_by TEXT NOT NULL,
        proposed_at TEXT NOT NULL,
        message     TEXT,
        approvals   TEXT NOT NULL,             -- JSON array of {actor, roles}
        decided_by  TEXT,
        decided_at  TEXT
    );
