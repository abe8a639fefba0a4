-- 39: the objects `kavi gc` is removing from the object store, or has removed: a row from the
-- moment gc has pruned the last artifact row that referenced the object (in the same
-- transaction), its `deleted_at` set by the transaction that removes the object (which holds
-- the row meanwhile), and kept until the content is recorded again. Whoever records an object's
-- location again removes the row, waiting for a removal under way, and, when there was one,
-- puts the object again from its own file: an object a run records is never one gc removes
-- after. Not journaled: bookkeeping of the store, which decides nothing the runs' rows record.

    CREATE TABLE object_deletions (
        sha256     TEXT PRIMARY KEY,
        location   TEXT NOT NULL,
        deleted_at TEXT
    );
