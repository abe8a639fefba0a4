-- 13: the confinement a skill ran under (JSON: role, enforcement, paths, network).

    ALTER TABLE executions ADD COLUMN confinement TEXT;
