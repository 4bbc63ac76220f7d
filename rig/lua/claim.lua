-- claim.lua: a card worker takes an ASSIGNED job and marks it RUNNING, at most once.
--
-- Celery may deliver the same start message twice (visibility timeout, reconnect restore);
-- only the delivery whose token matches the job's current assignment, while the job is still
-- ASSIGNED, wins. Every other delivery gets {0, state} and must do nothing.
--
-- KEYS[1]  job hash
-- KEYS[2]  state index ASSIGNED
-- KEYS[3]  state index RUNNING
-- ARGV[1]  job id
-- ARGV[2]  token (assignment number carried by the start message)
-- ARGV[3]  now (epoch seconds)
-- ARGV[4]  worker name
-- ARGV[5]  optional: the events channel, where '<id> RUNNING' is published when it is claimed
--
-- Returns {1, attempt} (the attempt number, from 1) or {0, current state}.

local f = redis.call('HMGET', KEYS[1], 'state', 'assignments')
if f[1] ~= 'ASSIGNED' or f[2] ~= ARGV[2] then
  return {0, tostring(f[1])}
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'state', 'RUNNING', 'started_at', ARGV[3], 'worker', ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], tonumber(ARGV[1]), ARGV[1])
if ARGV[5] and ARGV[5] ~= '' then
  redis.call('PUBLISH', ARGV[5], ARGV[1] .. ' RUNNING')
end
return {1, attempt}
