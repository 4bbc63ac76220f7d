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
-- KEYS[4]  optional: the metrics counters hash ('started' += 1)
-- KEYS[5]  optional: the start-wait histogram hash; on a job's first start, now - created_at
--          is counted in 'le:<b>' for every bound b >= it, in 'le:+Inf', 'count' and 'sum'
-- ARGV[6]  with KEYS[5]: the bounds, space-separated, written as the field names use them
-- KEYS[6]  optional: the installation hash (rig:installation); with ARGV[7], the id of the
--          installation this node joined ('' or absent: it joined none, no check): when the
--          hash's id is another or missing, the claim is refused with {0, 'installation-mismatch'}
--          (the mirror of rig.installation.Verdict.mismatch: never run another installation's job)
--
-- Returns {1, attempt} (the attempt number, from 1) or {0, current state}.

if KEYS[6] and ARGV[7] and ARGV[7] ~= '' and redis.call('HGET', KEYS[6], 'id') ~= ARGV[7] then
  return {0, 'installation-mismatch'}
end
local f = redis.call('HMGET', KEYS[1], 'state', 'assignments')
if f[1] ~= 'ASSIGNED' or f[2] ~= ARGV[2] then
  return {0, tostring(f[1])}
end
local attempt = redis.call('HINCRBY', KEYS[1], 'attempt', 1)
redis.call('HSET', KEYS[1], 'state', 'RUNNING', 'started_at', ARGV[3], 'worker', ARGV[4])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZADD', KEYS[3], tonumber(ARGV[1]), ARGV[1])
if KEYS[4] then
  redis.call('HINCRBY', KEYS[4], 'started', 1)
end
if KEYS[5] and attempt == 1 then
  local created = tonumber(redis.call('HGET', KEYS[1], 'created_at') or '')
  if created then
    local wait = math.max(0, tonumber(ARGV[3]) - created)
    for bound in string.gmatch(ARGV[6] or '', '%S+') do
      if wait <= tonumber(bound) then
        redis.call('HINCRBY', KEYS[5], 'le:' .. bound, 1)
      end
    end
    redis.call('HINCRBY', KEYS[5], 'le:+Inf', 1)
    redis.call('HINCRBY', KEYS[5], 'count', 1)
    redis.call('HINCRBYFLOAT', KEYS[5], 'sum', wait)
  end
end
if ARGV[5] and ARGV[5] ~= '' then
  redis.call('PUBLISH', ARGV[5], ARGV[1] .. ' RUNNING')
end
return {1, attempt}
