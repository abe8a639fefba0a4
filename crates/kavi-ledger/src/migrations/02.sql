-- 2: which policy texts governed each run.

    CREATE TABLE run_policies (
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        path        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        PRIMARY KEY (run_id, path)
    );
