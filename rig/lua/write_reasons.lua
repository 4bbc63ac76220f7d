-- write_reasons.lua: waiting jobs' reasons written in one command (a pipeline of one HSET per
-- job costs the client ~8 us each: the ~600 reasons a starting pass writes at 512 cards were
-- ~5 ms of the dispatcher's CPU in redis-py; one call is ~1 ms).
--
-- KEYS[1 .. n]  the jobs' hashes (rig:job:<id>)
-- ARGV[1]       the stamp of them all (wait_reason_at: epoch s on the shared clock)
-- ARGV[i + 1]   job i's reason (wait_reason)
--
-- Writes what `HSET KEYS[i] wait_reason ARGV[i + 1] wait_reason_at ARGV[1]` writes, for each i
-- (a hash gone meanwhile is made with these two fields, as that HSET makes it). Returns n.
for i, key in ipairs(KEYS) do
  redis.call('HSET', key, 'wait_reason', ARGV[i + 1], 'wait_reason_at', ARGV[1])
end
return #KEYS
