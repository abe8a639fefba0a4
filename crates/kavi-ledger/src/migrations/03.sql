-- 3: skills and their lifecycle.

    CREATE TABLE skills (
        name          TEXT PRIMARY KEY,
        description   TEXT NOT NULL,
        side_effect   TEXT NOT NULL,
        spec_artifact TEXT NOT NULL REFERENCES artifacts(sha256),  -- the SKILL_SPEC
        state         TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL
    );

    CREATE TABLE skill_transitions (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        skill       TEXT NOT NULL REFERENCES skills(name),
        from_state  TEXT,                      -- NULL when the skill is proposed
        to_state    TEXT NOT NULL,
        run_id      INTEGER REFERENCES runs(id),
        node_id     TEXT,
        actor       TEXT NOT NULL,
        at          TEXT NOT NULL,
        comment     TEXT
    );
    CREATE INDEX skill_transitions_skill ON skill_transitions(skill);
