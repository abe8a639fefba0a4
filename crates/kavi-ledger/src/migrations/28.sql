-- 28: each approval of an escalation, with the roles its giver held then (JSON array of
-- {actor, roles}): a requirement of several approvers is met one approval at a time.

    ALTER TABLE escalations ADD COLUMN approvals TEXT;
