-- 37: where an object store keeps a file artifact's content (`s3://BUCKET/KEY`), when kavi.toml
-- names one (`[object_store]`): every machine reads the content from there, and `ledger verify`
-- re-hashes it there. Journaled, as the artifact row it completes is: a location edited outside
-- kavi is evident.

    CREATE TABLE artifact_objects (
        sha256   TEXT PRIMARY KEY REFERENCES artifacts(sha256),
        location TEXT NOT NULL
    );
