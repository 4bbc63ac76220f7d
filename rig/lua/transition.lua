-- transition.lua: end (or requeue, or cancel) a job and release every reservation it holds.
--
-- KEYS[1]               job hash
-- KEYS[2]               pending zset
-- KEYS[3 .. 2+S]        state index zsets, one per state, in the order of ARGV[7]
-- KEYS[3+S + 2i]        card hash of the i-th card the job holds
-- KEYS[4+S + 2i]        its job reservations hash
-- ARGV[1]  job id
-- ARGV[2]  target state (a terminal state, or PENDING to requeue)
-- ARGV[3]  now (epoch seconds)
-- ARGV[4]  token: '' = any holder; else the job's assignment number must equal it
-- ARGV[5]  JSON object of extra fields to set on the job (strings)
-- ARGV[6]  mode: 'end' = move from any live state; 'cancel' = as 'end', except a RUNNING job
--          is only flagged cancel_requested (its worker stops it and ends it)
-- ARGV[7]  JSON list of state names matching KEYS[3 .. 2+S]
-- ARGV[8]  pending score (used when the target is PENDING)
-- ARGV[9]  the state the caller read the job in; the card keys were built from that read. If
--          the job has moved since (say it was assigned meanwhile), nothing changes and the
--          caller reads again: {3, current state}.
--
-- Returns {1, previous state} when moved, {2, 'RUNNING'} when a cancel was flagged,
-- {0, current state} when nothing changed (already terminal, or token mismatch).
-- Releasing is idempotent: a card gives back only what its reservations hash still records.

local job, pending = KEYS[1], KEYS[2]
local job_id, target, now, token, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6]
local states = cjson.decode(ARGV[7])
local nstates = #states

local f = redis.call('HMGET', job, 'state', 'assignments')
local state = f[1]
if not state then
  return {0, 'missing'}
end
if state == 'SUCCEEDED' or state == 'FAILED' or state == 'CANCELLED' then
  return {0, state}
end
if token ~= '' and f[2] ~= token then
  return {0, 'token:' .. tostring(state)}
end
if ARGV[9] ~= '' and ARGV[9] ~= state then
  return {3, state}
end
if mode == 'cancel' and state == 'RUNNING' then
  redis.call('HSET', job, 'cancel_requested', '1')
  return {2, 'RUNNING'}
end

for i = 1, nstates do
  if states[i] == state then
    redis.call('ZREM', KEYS[2 + i], job_id)
  end
end
for i = 1, nstates do
  if states[i] == target then
    redis.call('ZADD', KEYS[2 + i], tonumber(job_id), job_id)
  end
end

local first_card = 3 + nstates
local ncards = (#KEYS - first_card + 1) / 2
for i = 0, ncards - 1 do
  local card, holds = KEYS[first_card + 2 * i], KEYS[first_card + 1 + 2 * i]
  local amount = redis.call('HGET', holds, job_id)
  if amount then
    redis.call('HDEL', holds, job_id)
    redis.call('HINCRBY', card, 'reserved', -tonumber(amount))
    redis.call('HINCRBY', card, 'jobs', -1)
  end
end

redis.call('HSET', job, 'state', target)
local extra = cjson.decode(ARGV[5])
for k, v in pairs(extra) do
  redis.call('HSET', job, k, tostring(v))
end
if target == 'PENDING' then
  redis.call('ZADD', pending, tonumber(ARGV[8]), job_id)
  redis.call('HDEL', job, 'node', 'cards', 'pid', 'proc_start', 'worker', 'cancel_requested')
else
  redis.call('ZREM', pending, job_id)
  redis.call('HSET', job, 'ended_at', now)
end
return {1, state}
