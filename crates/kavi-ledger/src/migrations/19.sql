-- 19: the tool a gate ran from a declared toolchain, with its version (JSON).

    ALTER TABLE verifications ADD COLUMN tool TEXT;
