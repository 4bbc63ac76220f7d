-- archived.lua: forget in Redis a finished job that the archive now holds (rig.archiving), only
-- if its record is still what was archived. Runs after the archive's transaction committed: a
-- job that changed meanwhile (retried, so PENDING again or ended anew) stays, and is archived
-- again when it is finished and old enough (the archive replaces its row).
--
-- KEYS[1]  job hash
-- KEYS[2]  every job id (zset)
-- KEYS[3]  the index of the state it was archived in (zset)
-- KEYS[4]  the error queue (zset)
-- KEYS[5]  the job's spec (string: its command, env and workdir; rig.models.pack_spec)
-- ARGV[1]  job id
-- ARGV[2]  state as archived
-- ARGV[3]  ended_at as archived ('' if it had none)
-- ARGV[4]  attempt as archived ('' if it had none)
-- ARGV[5]  instance as archived ('' if it had none)
--
-- Returns 1 when the job was forgotten, 0 when its record changed or it is in the error queue
-- (left alone).

local f = redis.call('HMGET', KEYS[1], 'state', 'ended_at', 'attempt', 'instance')
if f[1] ~= ARGV[2] or (f[2] or '') ~= ARGV[3] or (f[3] or '') ~= ARGV[4] or (f[4] or '') ~= ARGV[5] then
  return 0
end
if redis.call('ZSCORE', KEYS[4], ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[5])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
return 1
