-- 24: a governing set kept once, under the hash its runs and node runs carry, instead of
-- once per run in run_policies: a pipeline run again over the same files adds no rows for
-- them. Runs from before keep their members in run_policies.

    CREATE TABLE governing_members (
        set_hash    TEXT NOT NULL,             -- runs.governing_hash (see spec/governing.rs)
        path        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        role        TEXT NOT NULL,
        PRIMARY KEY (set_hash, path)
    ) WITHOUT ROWID;
