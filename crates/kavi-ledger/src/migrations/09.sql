-- 9: a run started by `kavi approve` resumes the run that stopped for review.

    ALTER TABLE runs ADD COLUMN resumed_from INTEGER REFERENCES runs(id);
