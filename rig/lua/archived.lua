-- archived.lua: forget in Redis a finished job that the archive now holds (rig.archiving), only
-- if its record is still what was archived. Runs after the archive's transaction committed: a
-- job that changed meanwhile (retried, so PENDING again or ended anew) stays, and is archived
-- again when it is finished and old enough (the archive replaces its row).
--
-- KEYS[1]  job hash
-- KEYS[2]  every job id (zset)
-- KEYS[3]  the index of the state it was archived in (zset)
-- KEYS[4]  the error queue (zset)
-- KEYS[5]  the job's spec (string: its command and workdir, packed)
-- KEYS[6]  environment digest -> number of job records naming it (hash)
-- KEYS[7]  the job's environment blob (string; any key name when ARGV[6] is '')
-- ARGV[1]  job id
-- ARGV[2]  state as archived
-- ARGV[3]  ended_at as archived ('' if it had none)
-- ARGV[4]  attempt as archived ('' if it had none)
-- ARGV[5]  instance as archived ('' if it had none)
-- ARGV[6]  env_ref as archived ('' if it had none)
--
-- Returns 1 when the job was forgotten (and its environment blob with its last job), 0 when its
-- record changed or it is in the error queue (left alone), 2 when it was gone already (another
-- pass, whose lock lapsed, forgot it first).

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 2
end
local f = redis.call('HMGET', KEYS[1], 'state', 'ended_at', 'attempt', 'instance', 'env_ref')
if f[1] ~= ARGV[2] or (f[2] or '') ~= ARGV[3] or (f[3] or '') ~= ARGV[4] or (f[4] or '') ~= ARGV[5]
    or (f[5] or '') ~= ARGV[6] then
  return 0
end
if redis.call('ZSCORE', KEYS[4], ARGV[1]) then
  return 0
end
redis.call('DEL', KEYS[1], KEYS[5])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
if ARGV[6] ~= '' then
  if redis.call('HINCRBY', KEYS[6], ARGV[6], -1) <= 0 then
    redis.call('HDEL', KEYS[6], ARGV[6])
    redis.call('DEL', KEYS[7])
  end
end
return 1
