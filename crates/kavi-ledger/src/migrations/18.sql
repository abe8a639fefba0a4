-- 18: versions. A skill's row describes its newest version (`version`, its spec and state)
-- and the version that runs (`trusted_version`, with trusted_hash and trusted_tree); the
-- two differ while a new version of a trusted skill is forged. Each version's spec is kept.

    ALTER TABLE skills ADD COLUMN version INTEGER NOT NULL DEFAULT 1;
    ALTER TABLE skills ADD COLUMN trusted_version INTEGER;
    UPDATE skills SET trusted_version = 1 WHERE trusted_hash IS NOT NULL;
    CREATE TABLE skill_versions (
        skill         TEXT NOT NULL REFERENCES skills(name),
        version       INTEGER NOT NULL,
        spec_artifact TEXT NOT NULL REFERENCES artifacts(sha256),
        description   TEXT NOT NULL,
        side_effect   TEXT NOT NULL,
        proposed_at   TEXT NOT NULL,
        actor         TEXT NOT NULL,
        PRIMARY KEY (skill, version)
    );
    INSERT INTO skill_versions (skill, version, spec_artifact, description, side_effect,
                                proposed_at, actor)
        SELECT name, 1, spec_artifact, description, side_effect, created_at, 'unknown'
        FROM skills;
    ALTER TABLE promotions ADD COLUMN version INTEGER;
    UPDATE promotions SET version = 1;
    ALTER TABLE executions ADD COLUMN skill_version INTEGER;
