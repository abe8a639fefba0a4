-- 12: sandboxes kavi made, with the limits that govern them and the manifest of each tree as
-- it was before the builder ran: the diff gate's baseline, out of the builder's reach.

    CREATE TABLE sandboxes (
        id                INTEGER PRIMARY KEY AUTOINCREMENT,
        path              TEXT NOT NULL UNIQUE,
        run_id            INTEGER NOT NULL REFERENCES runs(id),
        node_id           TEXT NOT NULL,
        policy            TEXT NOT NULL,       -- the sandbox policy file
        max_file_bytes    INTEGER NOT NULL,
        max_total_bytes   INTEGER NOT NULL,
        max_changed_files INTEGER NOT NULL,
        keep_failed_ms    INTEGER NOT NULL,    -- how long it is kept after a failed run
        status            TEXT NOT NULL,       -- active | kept | removed
        created_at        TEXT NOT NULL,
        keep_until        TEXT,
        removed_at        TEXT,
        error             TEXT                 -- why it could not be removed, if it could not
    );
    CREATE INDEX sandboxes_run ON sandboxes(run_id);
    CREATE INDEX sandboxes_status ON sandboxes(status);

    CREATE TABLE sandbox_entries (
        sandbox_id  INTEGER NOT NULL REFERENCES sandboxes(id),
        path        TEXT NOT NULL,             -- relative, `/`-separated, escaped where not UTF-8
        kind        TEXT NOT NULL,             -- file | dir | symlink | fifo | socket | ...
        mode        INTEGER NOT NULL,
        size        INTEGER NOT NULL,
        links       INTEGER NOT NULL,
        sha256      TEXT,                      -- a regular file's content
        target      TEXT,                      -- a symlink's target
        PRIMARY KEY (sandbox_id, path)
    ) WITHOUT ROWID;
