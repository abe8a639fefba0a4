-- 25: a key's parts kept once, under the key (the SHA-256 over them, see cache/mod.rs),
-- instead of with every node run that recorded it: a node found up to date adds no copy.
-- node_cache.parts is NULL for node runs recorded since; earlier ones keep theirs (the
-- table is made again for the column to allow NULL).

    CREATE TABLE cache_parts (
        key         TEXT PRIMARY KEY,          -- sha256 hex over the parts
        parts       TEXT NOT NULL              -- JSON object: part name -> hash
    ) WITHOUT ROWID;
    CREATE TABLE node_cache_before_25 AS SELECT * FROM node_cache;
    DROP TABLE node_cache;
    CREATE TABLE node_cache (
        node_run_id INTEGER PRIMARY KEY REFERENCES node_runs(id),
        key         TEXT NOT NULL,             -- sha256 hex over the parts
        parts       TEXT,                      -- JSON object, for rows before 25; else in cache_parts
        files       TEXT NOT NULL,             -- JSON object: output path -> artifact sha256
        source      INTEGER,                   -- the node run a cached one took its result from
        note        TEXT                       -- why the key was not looked up, or missed
    );
    INSERT INTO node_cache (node_run_id, key, parts, files, source, note)
        SELECT node_run_id, key, parts, files, source, note FROM node_cache_before_25;
    DROP TABLE node_cache_before_25;
    CREATE INDEX node_cache_key ON node_cache(key);
