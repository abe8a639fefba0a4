-- 27: the journal's keyed MAC (NULL for entries written before, until `kavi ledger seal`),
-- and the ledger's identity: what the checkpoint log beside the key knows it by, journaled
-- and MACed like every row, so that a moved ledger keeps its log and a swapped one is seen.

    ALTER TABLE journal ADD COLUMN mac TEXT;
    CREATE TABLE ledger_identity (
        id          TEXT PRIMARY KEY,          -- a UUID, made when the ledger is first opened
        created_at  TEXT NOT NULL
    ) WITHOUT ROWID;
