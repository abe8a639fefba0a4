-- 14: an execution is recorded when it starts, so that one cut short by a killed kavi shows
-- as interrupted; its owner names the kavi process that ran it.

    ALTER TABLE executions ADD COLUMN status TEXT NOT NULL DEFAULT 'finished';  -- running | finished | interrupted
    ALTER TABLE executions ADD COLUMN owner TEXT;
    CREATE INDEX executions_running ON executions(status) WHERE status = 'running';
