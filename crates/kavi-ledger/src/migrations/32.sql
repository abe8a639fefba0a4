-- 32: the changes of rules a resumed run was started over (`kavi runs resume --allow-changed`),
-- one line each as resume listed them; NULL when none were overridden.

    ALTER TABLE runs ADD COLUMN allowed_changes TEXT;
