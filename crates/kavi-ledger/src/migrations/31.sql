-- 31: the attestation made at a promotion (a DSSE envelope, kept as an ATTESTATION artifact),
-- NULL for promotions before attestations or made with no signing key.

    ALTER TABLE promotions ADD COLUMN attestation TEXT REFERENCES artifacts(sha256);
