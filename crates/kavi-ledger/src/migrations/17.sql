-- 17: the trusted tree kept at promotion, which `kavi skill restore` puts back.

    ALTER TABLE skills ADD COLUMN trusted_tree TEXT REFERENCES artifacts(sha256);
