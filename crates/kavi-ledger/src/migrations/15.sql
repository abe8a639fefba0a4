-- 15: the proposal file a skill was proposed from, which trust re-reads and vouches for.
-- Skills proposed before it were proposed, by the shipped convention, from this path.

    ALTER TABLE skills ADD COLUMN proposal_path TEXT;
    UPDATE skills SET proposal_path = 'proposals/' || name || '.toml';
