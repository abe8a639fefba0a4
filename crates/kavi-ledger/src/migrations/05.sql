-- 5: trust: the hash each verification saw, the hash a skill was verified and trusted at,
-- and every promotion.

    ALTER TABLE verifications ADD COLUMN source_hash TEXT;
    ALTER TABLE skills ADD COLUMN verified_hash TEXT;
    ALTER TABLE skills ADD COLUMN trusted_hash TEXT;

    CREATE TABLE promotions (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        skill       TEXT NOT NULL REFERENCES skills(name),
        from_state  TEXT NOT NULL,
        to_state    TEXT NOT NULL,
        source_hash TEXT NOT NULL,
        run_id      INTEGER REFERENCES runs(id),
        node_id     TEXT,
        actor       TEXT NOT NULL,
        at          TEXT NOT NULL,
        comment     TEXT
    );
