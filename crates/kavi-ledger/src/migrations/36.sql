-- 36: a skill's gate results and executions found by the skill (`kavi serve`'s skill page, a
-- page at a time, newest first): each by an index in the order the page reads them, so a page
-- costs what the first one does however many the skill has. The gate results of the skill's
-- latest verifying run, also by the skill and the run.

    CREATE INDEX verifications_skill ON verifications(skill);
    CREATE INDEX verifications_skill_run ON verifications(skill, run_id);
    CREATE INDEX executions_skill ON executions(skill, started_at, id);
