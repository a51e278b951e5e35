-- This version creates nothing in the core; it exists so that a schema standing at it
-- migrates on. Business tables live in migration sets of their own (migrations.Set).
SELECT 1;
