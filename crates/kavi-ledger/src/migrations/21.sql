-- 21: the node run a `reused` node run took its outputs from (`kavi runs resume`).

    ALTER TABLE node_runs ADD COLUMN reused_from INTEGER REFERENCES node_runs(id);
