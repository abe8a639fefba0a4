-- 30: the rule set a skill's trusted version was promoted under (NULL for promotions
-- before rule sets, or before this column), which `[adoption] on_change` reads when a
-- newer set is adopted.

    ALTER TABLE skills ADD COLUMN trusted_rules INTEGER;
