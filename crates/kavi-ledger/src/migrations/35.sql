-- 35: the machine-local settings a run ran with (where its machine keeps the ledger, artifacts,
-- sandboxes, executions log and toolchains), as a JSON object, credentials taken out: recorded
-- for whoever reads the run, not part of its governing set. NULL for runs recorded before.

    ALTER TABLE runs ADD COLUMN local_settings TEXT;
