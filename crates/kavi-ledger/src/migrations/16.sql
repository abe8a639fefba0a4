-- 16: the journal, a hash chain over every change (see journal.rs); its triggers are made
-- for the schema as it stands after each migration. Runs record the account that started
-- them, and escalations the policy that raised them, for the self-approval rule.

    ALTER TABLE runs ADD COLUMN started_by TEXT;
    -- the governing set: run_policies holds every member with its role; runs and node runs
    -- carry the hash over it (see spec/governing.rs)
    ALTER TABLE run_policies ADD COLUMN role TEXT NOT NULL DEFAULT 'policy';
    ALTER TABLE runs ADD COLUMN governing_hash TEXT;
    ALTER TABLE node_runs ADD COLUMN governing_hash TEXT;
    ALTER TABLE escalations ADD COLUMN policy TEXT;   -- spec hash of the escalation rules
    CREATE TABLE journal (
        seq      INTEGER PRIMARY KEY,          -- 1, 2, 3, ... without gaps
        tbl      TEXT NOT NULL,                -- the table changed
        op       TEXT NOT NULL,                -- insert | update | delete | migrate | snapshot
        key      TEXT NOT NULL,                -- JSON array: the row's primary key (or rowid)
        content  TEXT NOT NULL,                -- JSON object: every column, after the change
        prev     TEXT NOT NULL,                -- the previous entry's hash ('' for the first)
        hash     TEXT NOT NULL                 -- sha256 hex of prev LF seq LF tbl LF op LF key LF content
    );
    CREATE TABLE checkpoints (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        seq         INTEGER NOT NULL,          -- the journal entry signed
        hash        TEXT NOT NULL,             -- its hash
        public_key  TEXT NOT NULL,             -- ed25519, hex
        signature   TEXT NOT NULL,             -- ed25519 over "kavi-checkpoint-v1" LF seq LF hash, hex
        at          TEXT NOT NULL
    );
