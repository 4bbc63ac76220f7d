-- bounded_runs.lua: one value pushed onto a bounded map of short lists (rig.bounded_runs): a user's
-- run times per command or per name (rig.estimates), peaks per name (--gpu-memory auto), kept in
-- one hash so that a sweep of a million distinct commands or names leaves at most ARGV[4]
-- entries, not a million keys. The rule is lib_runs.lua's
-- (transition.lua applies it too, when an ending's writes ride with the transition).
--
-- KEYS[1] hash   field (a command's digest, a name) -> values, newest first, space separated
-- KEYS[2] zset   field -> when it last ran (epoch s); the fields that ran longest ago leave
--                both keys once there are more than ARGV[4]
-- ARGV[1] field
-- ARGV[2] the value (text, as it is stored)
-- ARGV[3] values kept per field
-- ARGV[4] fields kept
-- ARGV[5] when this value was measured (epoch s): the field's score
-- ARGV[6] seconds both keys live after the last push
-- Returns the number of fields dropped.

--#include lib_runs

return bounded_runs(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6])
