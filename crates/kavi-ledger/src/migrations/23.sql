-- 23: who asked for a skill execution from outside kavi's commands (`mcp:<client>`).

    ALTER TABLE executions ADD COLUMN caller TEXT;
