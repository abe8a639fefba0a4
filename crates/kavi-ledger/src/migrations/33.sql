-- 33: leases. The claim on a node's attempt (`kavi pipeline step`): who runs it, as an owner
-- is named, and until when its lease holds unless renewed; NULL for attempts no step claimed.
-- And the lease of a run kavi runs itself, renewed while its kavi lives: once it has run out,
-- any kavi sharing the ledger recovers the run, on any machine. NULL for external runs and
-- runs before leases.

    ALTER TABLE node_runs ADD COLUMN claimed_by TEXT;
    ALTER TABLE node_runs ADD COLUMN lease_until TEXT;
    ALTER TABLE runs ADD COLUMN lease_until TEXT;
