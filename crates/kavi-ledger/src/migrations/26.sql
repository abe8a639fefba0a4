-- 26: the most a failed run's sandbox may hold and still be kept for review. NULL for
-- sandboxes made before, which are held to the default budget.

    ALTER TABLE sandboxes ADD COLUMN keep_max_bytes INTEGER;
