-- 22: the key of a node run that declared its inputs (see cache/mod.rs), its output files,
-- and for a `cached` one the node run it took its result from (not a foreign key: that run
-- may be pruned while this one stays).

    CREATE TABLE node_cache (
        node_run_id INTEGER PRIMARY KEY REFERENCES node_runs(id),
        key         TEXT NOT NULL,             -- sha256 hex over the parts
        parts       TEXT NOT NULL,             -- JSON object: part name -> hash
        files       TEXT NOT NULL,             -- JSON object: output path -> artifact sha256
        source      INTEGER,                   -- the node run a cached one took its result from
        note        TEXT                       -- why the key was not looked up, or missed
    );
    CREATE INDEX node_cache_key ON node_cache(key);
