-- Generated from MIGRATIONS in schema.rs: KAVI_BLESS=1 cargo test -p kavi-ledger schema

CREATE TABLE specs (
        hash        TEXT PRIMARY KEY,          -- 'sha256:<hex>' of the text
        path        TEXT NOT NULL,             -- where it was first read from
        text        TEXT NOT NULL,
        created_at  TEXT NOT NULL
    );

CREATE TABLE artifacts (
        sha256      TEXT PRIMARY KEY,          -- hex digest of the content
        kind        TEXT NOT NULL,             -- STDOUT, STDERR, RENDERED, BUILD_PACKET, ...
        size        INTEGER NOT NULL,
        path        TEXT NOT NULL,             -- relative to the artifact store
        created_at  TEXT NOT NULL
    );

CREATE TABLE runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        pipeline    TEXT NOT NULL,
        spec_path   TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        params      TEXT NOT NULL,             -- JSON object
        status      TEXT NOT NULL,
        started_at  TEXT NOT NULL,
        finished_at TEXT,
        duration_ms INTEGER,
        parent_run  INTEGER REFERENCES runs(id),
        owner       TEXT NOT NULL,             -- names the lock file held while the run is live
        error       TEXT
    , resumed_from INTEGER REFERENCES runs(id), started_by TEXT, governing_hash TEXT, allowed_changes TEXT, lease_until TEXT, local_settings TEXT);

CREATE INDEX runs_status ON runs(status);

CREATE TABLE node_runs (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        node_id     TEXT NOT NULL,
        kind        TEXT NOT NULL,
        state       TEXT NOT NULL,
        attempt     INTEGER NOT NULL,
        started_at  TEXT,
        finished_at TEXT,
        duration_ms INTEGER,
        exit_code   INTEGER,
        outputs     TEXT,                      -- JSON
        error       TEXT,                      -- why it failed
        reason      TEXT, governing_hash TEXT, reused_from INTEGER REFERENCES node_runs(id), claimed_by TEXT, lease_until TEXT,                      -- why it was skipped, blocked or cancelled
        UNIQUE (run_id, node_id, attempt)
    );

CREATE INDEX node_runs_run ON node_runs(run_id);

CREATE TABLE node_run_artifacts (
        node_run_id INTEGER NOT NULL REFERENCES node_runs(id),
        role        TEXT NOT NULL,             -- stdout, stderr, rendered, ...
        sha256      TEXT NOT NULL REFERENCES artifacts(sha256),
        PRIMARY KEY (node_run_id, role)
    );

CREATE TABLE run_policies (
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        path        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash), role TEXT NOT NULL DEFAULT 'policy',
        PRIMARY KEY (run_id, path)
    );

CREATE TABLE skills (
        name          TEXT PRIMARY KEY,
        description   TEXT NOT NULL,
        side_effect   TEXT NOT NULL,
        spec_artifact TEXT NOT NULL REFERENCES artifacts(sha256),  -- the SKILL_SPEC
        state         TEXT NOT NULL,
        created_at    TEXT NOT NULL,
        updated_at    TEXT NOT NULL
    , verified_hash TEXT, trusted_hash TEXT, proposal_path TEXT, trusted_tree TEXT REFERENCES artifacts(sha256), version INTEGER NOT NULL DEFAULT 1, trusted_version INTEGER, trusted_rules INTEGER);

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

CREATE TABLE verifications (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        run_id       INTEGER NOT NULL REFERENCES runs(id),
        node_id      TEXT NOT NULL,
        skill        TEXT,
        gate_id      TEXT NOT NULL,
        gate_kind    TEXT NOT NULL,
        required     INTEGER NOT NULL,
        status       TEXT NOT NULL,            -- passed | failed | error | timed_out
        failure_kind TEXT,                     -- set when not passed
        detail       TEXT,
        report       TEXT REFERENCES artifacts(sha256),
        at           TEXT NOT NULL
    , source_hash TEXT, tool TEXT);

CREATE INDEX verifications_run ON verifications(run_id);

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
    , version INTEGER, attestation TEXT REFERENCES artifacts(sha256));

CREATE TABLE builds (
        id           INTEGER PRIMARY KEY AUTOINCREMENT,
        skill        TEXT NOT NULL REFERENCES skills(name),
        attempt      INTEGER NOT NULL,
        parent_build INTEGER REFERENCES builds(id),
        run_id       INTEGER REFERENCES runs(id),
        node_id      TEXT,
        status       TEXT NOT NULL,            -- running | succeeded | failed
        packet       TEXT REFERENCES artifacts(sha256),
        log          TEXT REFERENCES artifacts(sha256),
        exit_code    INTEGER,
        started_at   TEXT NOT NULL,
        finished_at  TEXT, failure_kind TEXT, research_note TEXT REFERENCES artifacts(sha256), advisory TEXT REFERENCES artifacts(sha256), advisory_error TEXT,
        UNIQUE (skill, attempt)
    );

CREATE TABLE escalations (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        skill       TEXT NOT NULL REFERENCES skills(name),
        run_id      INTEGER NOT NULL REFERENCES runs(id),
        node_id     TEXT NOT NULL,
        triggers    TEXT NOT NULL,             -- JSON array of trigger names with reasons
        status      TEXT NOT NULL,             -- pending | approved | rejected
        raised_at   TEXT NOT NULL,
        decided_by  TEXT,
        decided_at  TEXT,
        comment     TEXT
    , policy TEXT, approvals TEXT);

CREATE INDEX escalations_skill ON escalations(skill);

CREATE TABLE executions (
        id          TEXT PRIMARY KEY,
        parent      TEXT REFERENCES executions(id),
        skill       TEXT NOT NULL,
        source_hash TEXT,                      -- the hash the skill was run at (NULL: not reached)
        side_effect TEXT NOT NULL,
        input       TEXT,                      -- JSON
        output      TEXT,                      -- JSON
        success     INTEGER NOT NULL,
        error       TEXT,
        started_at  TEXT NOT NULL,
        finished_at TEXT NOT NULL,
        duration_ms INTEGER NOT NULL,
        chain       TEXT,                      -- the chain and step that ran it, if any
        step        TEXT,
        run_id      INTEGER REFERENCES runs(id)
    , confinement TEXT, status TEXT NOT NULL DEFAULT 'finished', owner TEXT, skill_version INTEGER, caller TEXT);

CREATE INDEX executions_parent ON executions(parent);

CREATE INDEX executions_started ON executions(started_at);

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
    , keep_max_bytes INTEGER);

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

CREATE INDEX executions_running ON executions(status) WHERE status = 'running';

CREATE TABLE journal (
        seq      INTEGER PRIMARY KEY,          -- 1, 2, 3, ... without gaps
        tbl      TEXT NOT NULL,                -- the table changed
        op       TEXT NOT NULL,                -- insert | update | delete | migrate | snapshot
        key      TEXT NOT NULL,                -- JSON array: the row's primary key (or rowid)
        content  TEXT NOT NULL,                -- JSON object: every column, after the change
        prev     TEXT NOT NULL,                -- the previous entry's hash ('' for the first)
        hash     TEXT NOT NULL                 -- sha256 hex of prev LF seq LF tbl LF op LF key LF content
    , mac TEXT);

CREATE TABLE checkpoints (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        seq         INTEGER NOT NULL,          -- the journal entry signed
        hash        TEXT NOT NULL,             -- its hash
        public_key  TEXT NOT NULL,             -- ed25519, hex
        signature   TEXT NOT NULL,             -- ed25519 over "kavi-checkpoint-v1" LF seq LF hash, hex
        at          TEXT NOT NULL
    );

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

CREATE TABLE artifact_contents (
        sha256  TEXT PRIMARY KEY REFERENCES artifacts(sha256),
        content BLOB NOT NULL
    );

CREATE TABLE governing_members (
        set_hash    TEXT NOT NULL,             -- runs.governing_hash (see spec/governing.rs)
        path        TEXT NOT NULL,
        spec_hash   TEXT NOT NULL REFERENCES specs(hash),
        role        TEXT NOT NULL,
        PRIMARY KEY (set_hash, path)
    ) WITHOUT ROWID;

CREATE TABLE cache_parts (
        key         TEXT PRIMARY KEY,          -- sha256 hex over the parts
        parts       TEXT NOT NULL              -- JSON object: part name -> hash
    ) WITHOUT ROWID;

CREATE TABLE node_cache (
        node_run_id INTEGER PRIMARY KEY REFERENCES node_runs(id),
        key         TEXT NOT NULL,             -- sha256 hex over the parts
        parts       TEXT,                      -- JSON object, for rows before 25; else in cache_parts
        files       TEXT NOT NULL,             -- JSON object: output path -> artifact sha256
        source      INTEGER,                   -- the node run a cached one took its result from
        note        TEXT                       -- why the key was not looked up, or missed
    );

CREATE INDEX node_cache_key ON node_cache(key);

CREATE TABLE ledger_identity (
        id          TEXT PRIMARY KEY,          -- a UUID, made when the ledger is first opened
        created_at  TEXT NOT NULL
    ) WITHOUT ROWID;

CREATE TABLE rule_sets (
        id          INTEGER PRIMARY KEY AUTOINCREMENT,
        set_hash    TEXT NOT NULL,             -- set hash over (path, spec hash) of every file
        files       TEXT NOT NULL,             -- JSON object: path -> spec hash (texts in specs)
        status      TEXT NOT NULL,             -- pending | adopted | superseded | rejected
        class       TEXT NOT NULL,             -- first-use | weakening | strengthening | neutral
        changes     TEXT NOT NULL,             -- JSON array of {change, class}
        based_on    INTEGER,                   -- the adopted set it changes
        proposed_by TEXT NOT NULL,
        proposed_at TEXT NOT NULL,
        message     TEXT,
        approvals   TEXT NOT NULL,             -- JSON array of {actor, roles}
        decided_by  TEXT,
        decided_at  TEXT
    );

CREATE TABLE artifact_chunks (
        sha256  TEXT NOT NULL REFERENCES artifacts(sha256),
        seq     INTEGER NOT NULL,
        content BLOB NOT NULL,
        PRIMARY KEY (sha256, seq)
    );

CREATE INDEX verifications_skill ON verifications(skill);

CREATE INDEX verifications_skill_run ON verifications(skill, run_id);

CREATE INDEX executions_skill ON executions(skill, started_at, id);

CREATE TABLE artifact_objects (
        sha256   TEXT PRIMARY KEY REFERENCES artifacts(sha256),
        location TEXT NOT NULL
    );

CREATE TABLE group_slots (
        grp         TEXT NOT NULL,
        slot        INTEGER NOT NULL,
        holder      TEXT NOT NULL,
        lease_until TEXT NOT NULL,
        make_way    INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (grp, slot)
    );

CREATE TABLE object_deletions (
        sha256     TEXT PRIMARY KEY,
        location   TEXT NOT NULL,
        deleted_at TEXT
    );

CREATE VIEW journal_append (tbl, op, key, content) AS
           SELECT tbl, op, key, content FROM journal WHERE 1 = 0;

CREATE TRIGGER journal_append_entry INSTEAD OF INSERT ON journal_append BEGIN
           INSERT INTO journal (seq, tbl, op, key, content, prev, hash, mac)
           VALUES ((SELECT COALESCE(MAX(seq), 0) + 1 FROM journal), NEW.tbl, NEW.op, NEW.key, NEW.content, COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1), ''),
                   kavi_sha256(COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1), '') || char(10) || (SELECT COALESCE(MAX(seq), 0) + 1 FROM journal) || char(10) || NEW.tbl
                                   || char(10) || NEW.op || char(10) || NEW.key || char(10)
                                   || NEW.content), kavi_mac(kavi_sha256(COALESCE((SELECT hash FROM journal ORDER BY seq DESC LIMIT 1), '') || char(10) || (SELECT COALESCE(MAX(seq), 0) + 1 FROM journal) || char(10) || NEW.tbl
                                   || char(10) || NEW.op || char(10) || NEW.key || char(10)
                                   || NEW.content)));
         END;

CREATE TRIGGER "journal_artifact_objects_insert" AFTER INSERT ON "artifact_objects" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('artifact_objects', 'insert', json_array(NEW."sha256"), json_object('sha256', NEW."sha256", 'location', NEW."location"));
             END;

CREATE TRIGGER "journal_artifact_objects_update" AFTER UPDATE ON "artifact_objects" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('artifact_objects', 'update', json_array(NEW."sha256"), json_object('sha256', NEW."sha256", 'location', NEW."location"));
             END;

CREATE TRIGGER "journal_artifact_objects_delete" AFTER DELETE ON "artifact_objects" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('artifact_objects', 'delete', json_array(OLD."sha256"), json_object('sha256', OLD."sha256", 'location', OLD."location"));
             END;

CREATE TRIGGER "journal_artifacts_insert" AFTER INSERT ON "artifacts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('artifacts', 'insert', json_array(NEW."sha256"), json_object('sha256', NEW."sha256", 'kind', NEW."kind", 'size', NEW."size", 'path', NEW."path", 'created_at', NEW."created_at"));
             END;

CREATE TRIGGER "journal_artifacts_update" AFTER UPDATE ON "artifacts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('artifacts', 'update', json_array(NEW."sha256"), json_object('sha256', NEW."sha256", 'kind', NEW."kind", 'size', NEW."size", 'path', NEW."path", 'created_at', NEW."created_at"));
             END;

CREATE TRIGGER "journal_artifacts_delete" AFTER DELETE ON "artifacts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('artifacts', 'delete', json_array(OLD."sha256"), json_object('sha256', OLD."sha256", 'kind', OLD."kind", 'size', OLD."size", 'path', OLD."path", 'created_at', OLD."created_at"));
             END;

CREATE TRIGGER "journal_builds_insert" AFTER INSERT ON "builds" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('builds', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'attempt', NEW."attempt", 'parent_build', NEW."parent_build", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'status', NEW."status", 'packet', NEW."packet", 'log', NEW."log", 'exit_code', NEW."exit_code", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'failure_kind', NEW."failure_kind", 'research_note', NEW."research_note", 'advisory', NEW."advisory", 'advisory_error', NEW."advisory_error"));
             END;

CREATE TRIGGER "journal_builds_update" AFTER UPDATE ON "builds" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('builds', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'attempt', NEW."attempt", 'parent_build', NEW."parent_build", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'status', NEW."status", 'packet', NEW."packet", 'log', NEW."log", 'exit_code', NEW."exit_code", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'failure_kind', NEW."failure_kind", 'research_note', NEW."research_note", 'advisory', NEW."advisory", 'advisory_error', NEW."advisory_error"));
             END;

CREATE TRIGGER "journal_builds_delete" AFTER DELETE ON "builds" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('builds', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'skill', OLD."skill", 'attempt', OLD."attempt", 'parent_build', OLD."parent_build", 'run_id', OLD."run_id", 'node_id', OLD."node_id", 'status', OLD."status", 'packet', OLD."packet", 'log', OLD."log", 'exit_code', OLD."exit_code", 'started_at', OLD."started_at", 'finished_at', OLD."finished_at", 'failure_kind', OLD."failure_kind", 'research_note', OLD."research_note", 'advisory', OLD."advisory", 'advisory_error', OLD."advisory_error"));
             END;

CREATE TRIGGER "journal_cache_parts_insert" AFTER INSERT ON "cache_parts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('cache_parts', 'insert', json_array(NEW."key"), json_object('key', NEW."key", 'parts', NEW."parts"));
             END;

CREATE TRIGGER "journal_cache_parts_update" AFTER UPDATE ON "cache_parts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('cache_parts', 'update', json_array(NEW."key"), json_object('key', NEW."key", 'parts', NEW."parts"));
             END;

CREATE TRIGGER "journal_cache_parts_delete" AFTER DELETE ON "cache_parts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('cache_parts', 'delete', json_array(OLD."key"), json_object('key', OLD."key", 'parts', OLD."parts"));
             END;

CREATE TRIGGER "journal_checkpoints_insert" AFTER INSERT ON "checkpoints" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('checkpoints', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'seq', NEW."seq", 'hash', NEW."hash", 'public_key', NEW."public_key", 'signature', NEW."signature", 'at', NEW."at"));
             END;

CREATE TRIGGER "journal_checkpoints_update" AFTER UPDATE ON "checkpoints" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('checkpoints', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'seq', NEW."seq", 'hash', NEW."hash", 'public_key', NEW."public_key", 'signature', NEW."signature", 'at', NEW."at"));
             END;

CREATE TRIGGER "journal_checkpoints_delete" AFTER DELETE ON "checkpoints" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('checkpoints', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'seq', OLD."seq", 'hash', OLD."hash", 'public_key', OLD."public_key", 'signature', OLD."signature", 'at', OLD."at"));
             END;

CREATE TRIGGER "journal_escalations_insert" AFTER INSERT ON "escalations" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('escalations', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'triggers', NEW."triggers", 'status', NEW."status", 'raised_at', NEW."raised_at", 'decided_by', NEW."decided_by", 'decided_at', NEW."decided_at", 'comment', NEW."comment", 'policy', NEW."policy", 'approvals', NEW."approvals"));
             END;

CREATE TRIGGER "journal_escalations_update" AFTER UPDATE ON "escalations" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('escalations', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'triggers', NEW."triggers", 'status', NEW."status", 'raised_at', NEW."raised_at", 'decided_by', NEW."decided_by", 'decided_at', NEW."decided_at", 'comment', NEW."comment", 'policy', NEW."policy", 'approvals', NEW."approvals"));
             END;

CREATE TRIGGER "journal_escalations_delete" AFTER DELETE ON "escalations" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('escalations', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'skill', OLD."skill", 'run_id', OLD."run_id", 'node_id', OLD."node_id", 'triggers', OLD."triggers", 'status', OLD."status", 'raised_at', OLD."raised_at", 'decided_by', OLD."decided_by", 'decided_at', OLD."decided_at", 'comment', OLD."comment", 'policy', OLD."policy", 'approvals', OLD."approvals"));
             END;

CREATE TRIGGER "journal_executions_insert" AFTER INSERT ON "executions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('executions', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'parent', NEW."parent", 'skill', NEW."skill", 'source_hash', NEW."source_hash", 'side_effect', NEW."side_effect", 'input', NEW."input", 'output', NEW."output", 'success', NEW."success", 'error', NEW."error", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'duration_ms', NEW."duration_ms", 'chain', NEW."chain", 'step', NEW."step", 'run_id', NEW."run_id", 'confinement', NEW."confinement", 'status', NEW."status", 'owner', NEW."owner", 'skill_version', NEW."skill_version", 'caller', NEW."caller"));
             END;

CREATE TRIGGER "journal_executions_update" AFTER UPDATE ON "executions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('executions', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'parent', NEW."parent", 'skill', NEW."skill", 'source_hash', NEW."source_hash", 'side_effect', NEW."side_effect", 'input', NEW."input", 'output', NEW."output", 'success', NEW."success", 'error', NEW."error", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'duration_ms', NEW."duration_ms", 'chain', NEW."chain", 'step', NEW."step", 'run_id', NEW."run_id", 'confinement', NEW."confinement", 'status', NEW."status", 'owner', NEW."owner", 'skill_version', NEW."skill_version", 'caller', NEW."caller"));
             END;

CREATE TRIGGER "journal_executions_delete" AFTER DELETE ON "executions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('executions', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'parent', OLD."parent", 'skill', OLD."skill", 'source_hash', OLD."source_hash", 'side_effect', OLD."side_effect", 'input', OLD."input", 'output', OLD."output", 'success', OLD."success", 'error', OLD."error", 'started_at', OLD."started_at", 'finished_at', OLD."finished_at", 'duration_ms', OLD."duration_ms", 'chain', OLD."chain", 'step', OLD."step", 'run_id', OLD."run_id", 'confinement', OLD."confinement", 'status', OLD."status", 'owner', OLD."owner", 'skill_version', OLD."skill_version", 'caller', OLD."caller"));
             END;

CREATE TRIGGER "journal_governing_members_insert" AFTER INSERT ON "governing_members" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('governing_members', 'insert', json_array(NEW."set_hash", NEW."path"), json_object('set_hash', NEW."set_hash", 'path', NEW."path", 'spec_hash', NEW."spec_hash", 'role', NEW."role"));
             END;

CREATE TRIGGER "journal_governing_members_update" AFTER UPDATE ON "governing_members" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('governing_members', 'update', json_array(NEW."set_hash", NEW."path"), json_object('set_hash', NEW."set_hash", 'path', NEW."path", 'spec_hash', NEW."spec_hash", 'role', NEW."role"));
             END;

CREATE TRIGGER "journal_governing_members_delete" AFTER DELETE ON "governing_members" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('governing_members', 'delete', json_array(OLD."set_hash", OLD."path"), json_object('set_hash', OLD."set_hash", 'path', OLD."path", 'spec_hash', OLD."spec_hash", 'role', OLD."role"));
             END;

CREATE TRIGGER "journal_ledger_identity_insert" AFTER INSERT ON "ledger_identity" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('ledger_identity', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'created_at', NEW."created_at"));
             END;

CREATE TRIGGER "journal_ledger_identity_update" AFTER UPDATE ON "ledger_identity" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('ledger_identity', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'created_at', NEW."created_at"));
             END;

CREATE TRIGGER "journal_ledger_identity_delete" AFTER DELETE ON "ledger_identity" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('ledger_identity', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'created_at', OLD."created_at"));
             END;

CREATE TRIGGER "journal_node_cache_insert" AFTER INSERT ON "node_cache" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_cache', 'insert', json_array(NEW."node_run_id"), json_object('node_run_id', NEW."node_run_id", 'key', NEW."key", 'parts', NEW."parts", 'files', NEW."files", 'source', NEW."source", 'note', NEW."note"));
             END;

CREATE TRIGGER "journal_node_cache_update" AFTER UPDATE ON "node_cache" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_cache', 'update', json_array(NEW."node_run_id"), json_object('node_run_id', NEW."node_run_id", 'key', NEW."key", 'parts', NEW."parts", 'files', NEW."files", 'source', NEW."source", 'note', NEW."note"));
             END;

CREATE TRIGGER "journal_node_cache_delete" AFTER DELETE ON "node_cache" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_cache', 'delete', json_array(OLD."node_run_id"), json_object('node_run_id', OLD."node_run_id", 'key', OLD."key", 'parts', OLD."parts", 'files', OLD."files", 'source', OLD."source", 'note', OLD."note"));
             END;

CREATE TRIGGER "journal_node_run_artifacts_insert" AFTER INSERT ON "node_run_artifacts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_run_artifacts', 'insert', json_array(NEW."node_run_id", NEW."role"), json_object('node_run_id', NEW."node_run_id", 'role', NEW."role", 'sha256', NEW."sha256"));
             END;

CREATE TRIGGER "journal_node_run_artifacts_update" AFTER UPDATE ON "node_run_artifacts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_run_artifacts', 'update', json_array(NEW."node_run_id", NEW."role"), json_object('node_run_id', NEW."node_run_id", 'role', NEW."role", 'sha256', NEW."sha256"));
             END;

CREATE TRIGGER "journal_node_run_artifacts_delete" AFTER DELETE ON "node_run_artifacts" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_run_artifacts', 'delete', json_array(OLD."node_run_id", OLD."role"), json_object('node_run_id', OLD."node_run_id", 'role', OLD."role", 'sha256', OLD."sha256"));
             END;

CREATE TRIGGER "journal_node_runs_insert" AFTER INSERT ON "node_runs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_runs', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'kind', NEW."kind", 'state', NEW."state", 'attempt', NEW."attempt", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'duration_ms', NEW."duration_ms", 'exit_code', NEW."exit_code", 'outputs', NEW."outputs", 'error', NEW."error", 'reason', NEW."reason", 'governing_hash', NEW."governing_hash", 'reused_from', NEW."reused_from", 'claimed_by', NEW."claimed_by", 'lease_until', NEW."lease_until"));
             END;

CREATE TRIGGER "journal_node_runs_update" AFTER UPDATE ON "node_runs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_runs', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'kind', NEW."kind", 'state', NEW."state", 'attempt', NEW."attempt", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'duration_ms', NEW."duration_ms", 'exit_code', NEW."exit_code", 'outputs', NEW."outputs", 'error', NEW."error", 'reason', NEW."reason", 'governing_hash', NEW."governing_hash", 'reused_from', NEW."reused_from", 'claimed_by', NEW."claimed_by", 'lease_until', NEW."lease_until"));
             END;

CREATE TRIGGER "journal_node_runs_delete" AFTER DELETE ON "node_runs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('node_runs', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'run_id', OLD."run_id", 'node_id', OLD."node_id", 'kind', OLD."kind", 'state', OLD."state", 'attempt', OLD."attempt", 'started_at', OLD."started_at", 'finished_at', OLD."finished_at", 'duration_ms', OLD."duration_ms", 'exit_code', OLD."exit_code", 'outputs', OLD."outputs", 'error', OLD."error", 'reason', OLD."reason", 'governing_hash', OLD."governing_hash", 'reused_from', OLD."reused_from", 'claimed_by', OLD."claimed_by", 'lease_until', OLD."lease_until"));
             END;

CREATE TRIGGER "journal_promotions_insert" AFTER INSERT ON "promotions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('promotions', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'from_state', NEW."from_state", 'to_state', NEW."to_state", 'source_hash', NEW."source_hash", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'actor', NEW."actor", 'at', NEW."at", 'comment', NEW."comment", 'version', NEW."version", 'attestation', NEW."attestation"));
             END;

CREATE TRIGGER "journal_promotions_update" AFTER UPDATE ON "promotions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('promotions', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'from_state', NEW."from_state", 'to_state', NEW."to_state", 'source_hash', NEW."source_hash", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'actor', NEW."actor", 'at', NEW."at", 'comment', NEW."comment", 'version', NEW."version", 'attestation', NEW."attestation"));
             END;

CREATE TRIGGER "journal_promotions_delete" AFTER DELETE ON "promotions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('promotions', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'skill', OLD."skill", 'from_state', OLD."from_state", 'to_state', OLD."to_state", 'source_hash', OLD."source_hash", 'run_id', OLD."run_id", 'node_id', OLD."node_id", 'actor', OLD."actor", 'at', OLD."at", 'comment', OLD."comment", 'version', OLD."version", 'attestation', OLD."attestation"));
             END;

CREATE TRIGGER "journal_rule_sets_insert" AFTER INSERT ON "rule_sets" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('rule_sets', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'set_hash', NEW."set_hash", 'files', NEW."files", 'status', NEW."status", 'class', NEW."class", 'changes', NEW."changes", 'based_on', NEW."based_on", 'proposed_by', NEW."proposed_by", 'proposed_at', NEW."proposed_at", 'message', NEW."message", 'approvals', NEW."approvals", 'decided_by', NEW."decided_by", 'decided_at', NEW."decided_at"));
             END;

CREATE TRIGGER "journal_rule_sets_update" AFTER UPDATE ON "rule_sets" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('rule_sets', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'set_hash', NEW."set_hash", 'files', NEW."files", 'status', NEW."status", 'class', NEW."class", 'changes', NEW."changes", 'based_on', NEW."based_on", 'proposed_by', NEW."proposed_by", 'proposed_at', NEW."proposed_at", 'message', NEW."message", 'approvals', NEW."approvals", 'decided_by', NEW."decided_by", 'decided_at', NEW."decided_at"));
             END;

CREATE TRIGGER "journal_rule_sets_delete" AFTER DELETE ON "rule_sets" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('rule_sets', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'set_hash', OLD."set_hash", 'files', OLD."files", 'status', OLD."status", 'class', OLD."class", 'changes', OLD."changes", 'based_on', OLD."based_on", 'proposed_by', OLD."proposed_by", 'proposed_at', OLD."proposed_at", 'message', OLD."message", 'approvals', OLD."approvals", 'decided_by', OLD."decided_by", 'decided_at', OLD."decided_at"));
             END;

CREATE TRIGGER "journal_run_policies_insert" AFTER INSERT ON "run_policies" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('run_policies', 'insert', json_array(NEW."run_id", NEW."path"), json_object('run_id', NEW."run_id", 'path', NEW."path", 'spec_hash', NEW."spec_hash", 'role', NEW."role"));
             END;

CREATE TRIGGER "journal_run_policies_update" AFTER UPDATE ON "run_policies" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('run_policies', 'update', json_array(NEW."run_id", NEW."path"), json_object('run_id', NEW."run_id", 'path', NEW."path", 'spec_hash', NEW."spec_hash", 'role', NEW."role"));
             END;

CREATE TRIGGER "journal_run_policies_delete" AFTER DELETE ON "run_policies" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('run_policies', 'delete', json_array(OLD."run_id", OLD."path"), json_object('run_id', OLD."run_id", 'path', OLD."path", 'spec_hash', OLD."spec_hash", 'role', OLD."role"));
             END;

CREATE TRIGGER "journal_runs_insert" AFTER INSERT ON "runs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('runs', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'pipeline', NEW."pipeline", 'spec_path', NEW."spec_path", 'spec_hash', NEW."spec_hash", 'params', NEW."params", 'status', NEW."status", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'duration_ms', NEW."duration_ms", 'parent_run', NEW."parent_run", 'owner', NEW."owner", 'error', NEW."error", 'resumed_from', NEW."resumed_from", 'started_by', NEW."started_by", 'governing_hash', NEW."governing_hash", 'allowed_changes', NEW."allowed_changes", 'lease_until', NEW."lease_until", 'local_settings', NEW."local_settings"));
             END;

CREATE TRIGGER "journal_runs_update" AFTER UPDATE ON "runs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('runs', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'pipeline', NEW."pipeline", 'spec_path', NEW."spec_path", 'spec_hash', NEW."spec_hash", 'params', NEW."params", 'status', NEW."status", 'started_at', NEW."started_at", 'finished_at', NEW."finished_at", 'duration_ms', NEW."duration_ms", 'parent_run', NEW."parent_run", 'owner', NEW."owner", 'error', NEW."error", 'resumed_from', NEW."resumed_from", 'started_by', NEW."started_by", 'governing_hash', NEW."governing_hash", 'allowed_changes', NEW."allowed_changes", 'lease_until', NEW."lease_until", 'local_settings', NEW."local_settings"));
             END;

CREATE TRIGGER "journal_runs_delete" AFTER DELETE ON "runs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('runs', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'pipeline', OLD."pipeline", 'spec_path', OLD."spec_path", 'spec_hash', OLD."spec_hash", 'params', OLD."params", 'status', OLD."status", 'started_at', OLD."started_at", 'finished_at', OLD."finished_at", 'duration_ms', OLD."duration_ms", 'parent_run', OLD."parent_run", 'owner', OLD."owner", 'error', OLD."error", 'resumed_from', OLD."resumed_from", 'started_by', OLD."started_by", 'governing_hash', OLD."governing_hash", 'allowed_changes', OLD."allowed_changes", 'lease_until', OLD."lease_until", 'local_settings', OLD."local_settings"));
             END;

CREATE TRIGGER "journal_sandbox_entries_insert" AFTER INSERT ON "sandbox_entries" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('sandbox_entries', 'insert', json_array(NEW."sandbox_id", NEW."path"), json_object('sandbox_id', NEW."sandbox_id", 'path', NEW."path", 'kind', NEW."kind", 'mode', NEW."mode", 'size', NEW."size", 'links', NEW."links", 'sha256', NEW."sha256", 'target', NEW."target"));
             END;

CREATE TRIGGER "journal_sandbox_entries_update" AFTER UPDATE ON "sandbox_entries" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('sandbox_entries', 'update', json_array(NEW."sandbox_id", NEW."path"), json_object('sandbox_id', NEW."sandbox_id", 'path', NEW."path", 'kind', NEW."kind", 'mode', NEW."mode", 'size', NEW."size", 'links', NEW."links", 'sha256', NEW."sha256", 'target', NEW."target"));
             END;

CREATE TRIGGER "journal_sandbox_entries_delete" AFTER DELETE ON "sandbox_entries" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('sandbox_entries', 'delete', json_array(OLD."sandbox_id", OLD."path"), json_object('sandbox_id', OLD."sandbox_id", 'path', OLD."path", 'kind', OLD."kind", 'mode', OLD."mode", 'size', OLD."size", 'links', OLD."links", 'sha256', OLD."sha256", 'target', OLD."target"));
             END;

CREATE TRIGGER "journal_sandboxes_insert" AFTER INSERT ON "sandboxes" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('sandboxes', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'path', NEW."path", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'policy', NEW."policy", 'max_file_bytes', NEW."max_file_bytes", 'max_total_bytes', NEW."max_total_bytes", 'max_changed_files', NEW."max_changed_files", 'keep_failed_ms', NEW."keep_failed_ms", 'status', NEW."status", 'created_at', NEW."created_at", 'keep_until', NEW."keep_until", 'removed_at', NEW."removed_at", 'error', NEW."error", 'keep_max_bytes', NEW."keep_max_bytes"));
             END;

CREATE TRIGGER "journal_sandboxes_update" AFTER UPDATE ON "sandboxes" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('sandboxes', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'path', NEW."path", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'policy', NEW."policy", 'max_file_bytes', NEW."max_file_bytes", 'max_total_bytes', NEW."max_total_bytes", 'max_changed_files', NEW."max_changed_files", 'keep_failed_ms', NEW."keep_failed_ms", 'status', NEW."status", 'created_at', NEW."created_at", 'keep_until', NEW."keep_until", 'removed_at', NEW."removed_at", 'error', NEW."error", 'keep_max_bytes', NEW."keep_max_bytes"));
             END;

CREATE TRIGGER "journal_sandboxes_delete" AFTER DELETE ON "sandboxes" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('sandboxes', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'path', OLD."path", 'run_id', OLD."run_id", 'node_id', OLD."node_id", 'policy', OLD."policy", 'max_file_bytes', OLD."max_file_bytes", 'max_total_bytes', OLD."max_total_bytes", 'max_changed_files', OLD."max_changed_files", 'keep_failed_ms', OLD."keep_failed_ms", 'status', OLD."status", 'created_at', OLD."created_at", 'keep_until', OLD."keep_until", 'removed_at', OLD."removed_at", 'error', OLD."error", 'keep_max_bytes', OLD."keep_max_bytes"));
             END;

CREATE TRIGGER "journal_skill_transitions_insert" AFTER INSERT ON "skill_transitions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skill_transitions', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'from_state', NEW."from_state", 'to_state', NEW."to_state", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'actor', NEW."actor", 'at', NEW."at", 'comment', NEW."comment"));
             END;

CREATE TRIGGER "journal_skill_transitions_update" AFTER UPDATE ON "skill_transitions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skill_transitions', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'skill', NEW."skill", 'from_state', NEW."from_state", 'to_state', NEW."to_state", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'actor', NEW."actor", 'at', NEW."at", 'comment', NEW."comment"));
             END;

CREATE TRIGGER "journal_skill_transitions_delete" AFTER DELETE ON "skill_transitions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skill_transitions', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'skill', OLD."skill", 'from_state', OLD."from_state", 'to_state', OLD."to_state", 'run_id', OLD."run_id", 'node_id', OLD."node_id", 'actor', OLD."actor", 'at', OLD."at", 'comment', OLD."comment"));
             END;

CREATE TRIGGER "journal_skill_versions_insert" AFTER INSERT ON "skill_versions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skill_versions', 'insert', json_array(NEW."skill", NEW."version"), json_object('skill', NEW."skill", 'version', NEW."version", 'spec_artifact', NEW."spec_artifact", 'description', NEW."description", 'side_effect', NEW."side_effect", 'proposed_at', NEW."proposed_at", 'actor', NEW."actor"));
             END;

CREATE TRIGGER "journal_skill_versions_update" AFTER UPDATE ON "skill_versions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skill_versions', 'update', json_array(NEW."skill", NEW."version"), json_object('skill', NEW."skill", 'version', NEW."version", 'spec_artifact', NEW."spec_artifact", 'description', NEW."description", 'side_effect', NEW."side_effect", 'proposed_at', NEW."proposed_at", 'actor', NEW."actor"));
             END;

CREATE TRIGGER "journal_skill_versions_delete" AFTER DELETE ON "skill_versions" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skill_versions', 'delete', json_array(OLD."skill", OLD."version"), json_object('skill', OLD."skill", 'version', OLD."version", 'spec_artifact', OLD."spec_artifact", 'description', OLD."description", 'side_effect', OLD."side_effect", 'proposed_at', OLD."proposed_at", 'actor', OLD."actor"));
             END;

CREATE TRIGGER "journal_skills_insert" AFTER INSERT ON "skills" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skills', 'insert', json_array(NEW."name"), json_object('name', NEW."name", 'description', NEW."description", 'side_effect', NEW."side_effect", 'spec_artifact', NEW."spec_artifact", 'state', NEW."state", 'created_at', NEW."created_at", 'updated_at', NEW."updated_at", 'verified_hash', NEW."verified_hash", 'trusted_hash', NEW."trusted_hash", 'proposal_path', NEW."proposal_path", 'trusted_tree', NEW."trusted_tree", 'version', NEW."version", 'trusted_version', NEW."trusted_version", 'trusted_rules', NEW."trusted_rules"));
             END;

CREATE TRIGGER "journal_skills_update" AFTER UPDATE ON "skills" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skills', 'update', json_array(NEW."name"), json_object('name', NEW."name", 'description', NEW."description", 'side_effect', NEW."side_effect", 'spec_artifact', NEW."spec_artifact", 'state', NEW."state", 'created_at', NEW."created_at", 'updated_at', NEW."updated_at", 'verified_hash', NEW."verified_hash", 'trusted_hash', NEW."trusted_hash", 'proposal_path', NEW."proposal_path", 'trusted_tree', NEW."trusted_tree", 'version', NEW."version", 'trusted_version', NEW."trusted_version", 'trusted_rules', NEW."trusted_rules"));
             END;

CREATE TRIGGER "journal_skills_delete" AFTER DELETE ON "skills" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('skills', 'delete', json_array(OLD."name"), json_object('name', OLD."name", 'description', OLD."description", 'side_effect', OLD."side_effect", 'spec_artifact', OLD."spec_artifact", 'state', OLD."state", 'created_at', OLD."created_at", 'updated_at', OLD."updated_at", 'verified_hash', OLD."verified_hash", 'trusted_hash', OLD."trusted_hash", 'proposal_path', OLD."proposal_path", 'trusted_tree', OLD."trusted_tree", 'version', OLD."version", 'trusted_version', OLD."trusted_version", 'trusted_rules', OLD."trusted_rules"));
             END;

CREATE TRIGGER "journal_specs_insert" AFTER INSERT ON "specs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('specs', 'insert', json_array(NEW."hash"), json_object('hash', NEW."hash", 'path', NEW."path", 'text', NEW."text", 'created_at', NEW."created_at"));
             END;

CREATE TRIGGER "journal_specs_update" AFTER UPDATE ON "specs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('specs', 'update', json_array(NEW."hash"), json_object('hash', NEW."hash", 'path', NEW."path", 'text', NEW."text", 'created_at', NEW."created_at"));
             END;

CREATE TRIGGER "journal_specs_delete" AFTER DELETE ON "specs" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('specs', 'delete', json_array(OLD."hash"), json_object('hash', OLD."hash", 'path', OLD."path", 'text', OLD."text", 'created_at', OLD."created_at"));
             END;

CREATE TRIGGER "journal_verifications_insert" AFTER INSERT ON "verifications" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('verifications', 'insert', json_array(NEW."id"), json_object('id', NEW."id", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'skill', NEW."skill", 'gate_id', NEW."gate_id", 'gate_kind', NEW."gate_kind", 'required', NEW."required", 'status', NEW."status", 'failure_kind', NEW."failure_kind", 'detail', NEW."detail", 'report', NEW."report", 'at', NEW."at", 'source_hash', NEW."source_hash", 'tool', NEW."tool"));
             END;

CREATE TRIGGER "journal_verifications_update" AFTER UPDATE ON "verifications" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('verifications', 'update', json_array(NEW."id"), json_object('id', NEW."id", 'run_id', NEW."run_id", 'node_id', NEW."node_id", 'skill', NEW."skill", 'gate_id', NEW."gate_id", 'gate_kind', NEW."gate_kind", 'required', NEW."required", 'status', NEW."status", 'failure_kind', NEW."failure_kind", 'detail', NEW."detail", 'report', NEW."report", 'at', NEW."at", 'source_hash', NEW."source_hash", 'tool', NEW."tool"));
             END;

CREATE TRIGGER "journal_verifications_delete" AFTER DELETE ON "verifications" BEGIN
               INSERT INTO journal_append (tbl, op, key, content)
               VALUES ('verifications', 'delete', json_array(OLD."id"), json_object('id', OLD."id", 'run_id', OLD."run_id", 'node_id', OLD."node_id", 'skill', OLD."skill", 'gate_id', OLD."gate_id", 'gate_kind', OLD."gate_kind", 'required', OLD."required", 'status', OLD."status", 'failure_kind', OLD."failure_kind", 'detail', OLD."detail", 'report', OLD."report", 'at', OLD."at", 'source_hash', OLD."source_hash", 'tool', OLD."tool"));
             END;
