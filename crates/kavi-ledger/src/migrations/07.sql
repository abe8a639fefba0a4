-- 7: a failed build's classification and research note, for the next attempt's packet.

    ALTER TABLE builds ADD COLUMN failure_kind TEXT;
    ALTER TABLE builds ADD COLUMN research_note TEXT REFERENCES artifacts(sha256);
