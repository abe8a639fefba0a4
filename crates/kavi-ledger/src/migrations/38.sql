-- 38: the slots of concurrency groups on a server's ledger, which every machine sharing it
-- takes its slots from: a row per slot held, by whom (`pid@host`), until when (a lease its holder
-- renews, as a node's claim), and whether another kavi asked its holder to make way
-- (`on_conflict = "cancel-running"`). A slot whose lease ran out is free: its holder died, or its
-- machine did. Unused on SQLite, whose processes share a machine and hold lock files. Not
-- journaled: a slot is held for a while and decides nothing the runs' rows do not record.

    CREATE TABLE group_slots (
        grp         TEXT NOT NULL,
        slot        INTEGER NOT NULL,
        holder      TEXT NOT NULL,
        lease_until TEXT NOT NULL,
        make_way    INTEGER NOT NULL DEFAULT 0,
        PRIMARY KEY (grp, slot)
    );
