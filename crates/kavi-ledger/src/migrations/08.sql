-- 8: escalations to a person, and the decisions on them.

    CREATE TABLE escalations (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        skill       TEXT NOT NULL REFERENCES skills(name),
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        node_id     TEXT NOT NULL,
        triggers    TEXT NOT NULL,             -- JSON array of trigger names with reasons
        status      TEXT NOT NULL,             -- pending | approved | rejected
        raised_at   TEXT NOT NULL,
        decided_by  TEXT,
        decided_at  TEXT,
        comment     TEXT
    );
    CREATE INDEX escalations_skill ON escalations(skill);
