-- 10: the advisory a failed build got from the LLM gateway: a revised packet, or why not.

    ALTER TABLE builds ADD COLUMN advisory TEXT REFERENCES artifacts(sha256);
    ALTER TABLE builds ADD COLUMN advisory_error TEXT;
