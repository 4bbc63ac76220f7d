-- transition.lua: move a job between states and release every reservation it holds, atomically.
--
-- KEYS[1]               job hash
-- KEYS[2]               pending zset
-- KEYS[3]               error queue zset (jobs waiting for a person)
-- KEYS[4]               the job's user's pending zset (fair share)
-- KEYS[5]               users with waiting jobs (set)
-- KEYS[6]               the user's recent usage hash (value GiB-hours, at epoch s)
-- KEYS[7]               the metrics counters hash: when the job moves, 'requeued' += 1 (to
--                       PENDING from a live state) or 'ended:<target>:<failure>' += 1 (to an
--                       end state; failure: the job's class for FAILED / TIMEOUT, else '')
-- KEYS[8 .. 7+S]        state index zsets, one per state, in the order of ARGV[7]
-- KEYS[8+S + 2i]        card hash of the i-th card the job holds
-- KEYS[9+S + 2i]        its job reservations hash
-- KEYS[#KEYS-W+1 ..]    the keys of the writes in ARGV[15] (W = ARGV[16], 0 without)
-- ARGV[1]  job id
-- ARGV[2]  target state
-- ARGV[3]  now (epoch seconds)
-- ARGV[4]  token: '' = any holder; else the job's assignment number must equal it
-- ARGV[5]  JSON object of extra fields to set on the job (values become strings)
-- ARGV[6]  mode:
--            'end'    from a live state (PENDING, ASSIGNED, RUNNING) to the target; a PENDING
--                     target requeues the job (it keeps its place: the score is by job id)
--            'cancel' as 'end', except that a RUNNING job is only flagged cancel_requested
--                     (its worker stops the process tree and ends it)
--            'retry'  from the error queue back to PENDING (a person decided)
-- ARGV[7]  JSON list of state names matching KEYS[4 .. 3+S]
-- ARGV[8]  pending score (used when the target is PENDING)
-- ARGV[9]  the state the caller read the job in (the card keys come from that read), or '';
--          if the job has moved since, nothing changes: {3, current state}
-- ARGV[10] '1' to put the job in the error queue (it ends and waits for a person)
-- ARGV[11] fair-share half-life (s); when a RUNNING job leaves RUNNING its GiB-hours are added
--          to KEYS[6], older usage decayed by this half-life
-- ARGV[12] the job's user
-- ARGV[13] the job's assignment number as the caller read it ('' = not fenced: the record's own
--          was unreadable); if it differs now, the job was placed again since the read and the
--          card keys are stale: nothing changes, {3, current state}
-- ARGV[14] optional: the events channel, where '<id> <target>' is published when it moved
-- ARGV[15] optional: JSON list of writes done only when the job moved, in the same step (an
--          ending's run history and the dispatcher's wake-up: rig.ledger.Writes). Each is
--          [command, k, a1, a2, ...]: the first k arguments are keys, given as 1-based places
--          among the writes' keys (KEYS[#KEYS-W+1 ..]), the rest literal strings; the command
--          'bounded_runs' is lib_runs.lua's rule (what bounded_runs.lua runs), any other a Redis
--          command
-- ARGV[16] optional: W, how many keys at the end of KEYS are the writes' (default 0)
-- ARGV[17] JSON list of the fields a job loses when it goes back to PENDING
--          (rig.models.REQUEUE_CLEARS: its placement and its attempt's process and end);
--          a job that goes back from another state gets 'queued_at' = now (rig.models.waiting_since)
--
-- Returns {1, previous state} when moved, {2, 'RUNNING'} when a cancel was flagged, {0, state}
-- when nothing changed (not allowed from this state, or token mismatch), {3, state} (see ARGV[9]).
-- Releasing is idempotent: a card gives back only what its reservations hash still records.

--#include lib_queue
--#include lib_card
--#include lib_runs

local job, pending, errors = KEYS[1], KEYS[2], KEYS[3]
local job_id, target, now, token, mode = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[6]
local states = cjson.decode(ARGV[7])
local nstates = #states
local nwrite_keys = tonumber(ARGV[16] or '0') or 0

local f = redis.call('HMGET', job, 'state', 'assignments')
local state = f[1]
if not state then
  return {0, 'missing'}
end
local live = (state == 'PENDING' or state == 'ASSIGNED' or state == 'RUNNING')
if mode == 'retry' then
  if redis.call('ZSCORE', errors, job_id) == false then
    return {0, state}
  end
elseif not live then
  return {0, state}
end
if token ~= '' and f[2] ~= token then
  return {0, 'token:' .. tostring(state)}
end
if ARGV[9] ~= '' and ARGV[9] ~= state then
  return {3, state}
end
-- The fence: the state alone cannot tell a job that moved away and came back (ASSIGNED on card
-- 0, requeued, ASSIGNED on card 1) from one that never moved; its assignment number can.
if ARGV[13] ~= nil and ARGV[13] ~= '' and (f[2] or '0') ~= ARGV[13] then
  return {3, state}
end
if mode == 'cancel' and state == 'RUNNING' then
  redis.call('HSET', job, 'cancel_requested', '1')
  return {2, 'RUNNING'}
end

for i = 1, nstates do
  if states[i] == state then
    redis.call('ZREM', KEYS[7 + i], job_id)
  end
end
for i = 1, nstates do
  if states[i] == target then
    redis.call('ZADD', KEYS[7 + i], tonumber(job_id), job_id)
  end
end

local first_card = 8 + nstates
local ncards = (#KEYS - nwrite_keys - first_card + 1) / 2
for i = 0, ncards - 1 do
  local card, holds = KEYS[first_card + 2 * i], KEYS[first_card + 1 + 2 * i]
  local amount = redis.call('HGET', holds, job_id)
  if amount then
    redis.call('HDEL', holds, job_id)
    redis.call('HINCRBY', card, 'reserved', -tonumber(amount))
    redis.call('HINCRBY', card, 'jobs', -1)
    card_recount(card, holds)  -- never below what is still reserved there (nor below 0)
    card_bump(card)
  end
end

if state == 'RUNNING' then
  -- Fair share: this attempt's GiB-hours join the user's decayed recent usage.
  local r = redis.call('HMGET', job, 'started_at', 'gpu_memory', 'cards')
  local started, bytes = tonumber(r[1] or ''), tonumber(r[2] or '')
  local ok_cards, cards = pcall(cjson.decode, r[3] or '[]')
  local half_life = tonumber(ARGV[11] or '')
  if started and bytes and ok_cards and type(cards) == 'table' and half_life and half_life > 0 then
    local t = tonumber(now)
    local used = bytes * math.max(#cards, 1) / 1073741824 * math.max(0, t - started) / 3600
    local u = redis.call('HMGET', KEYS[6], 'value', 'at')
    local value, at = tonumber(u[1] or '0') or 0, tonumber(u[2] or '') or t
    if t > at then
      value = value * math.pow(0.5, (t - at) / half_life)
    end
    redis.call('HSET', KEYS[6], 'value', tostring(value + used), 'at', tostring(t))
  end
end

redis.call('HSET', job, 'state', target)
local extra = cjson.decode(ARGV[5])
for k, v in pairs(extra) do
  redis.call('HSET', job, k, tostring(v))
end
redis.call('ZREM', errors, job_id)
if target == 'PENDING' then
  redis.call('ZADD', pending, tonumber(ARGV[8]), job_id)
  redis.call('ZADD', KEYS[4], tonumber(ARGV[8]), job_id)
  redis.call('SADD', KEYS[5], ARGV[12])
  redis.call('HDEL', job, unpack(cjson.decode(ARGV[17])))
  if state ~= 'PENDING' then
    -- It enters the queue again now: its wait counts from here (rig.models.waiting_since).
    redis.call('HSET', job, 'queued_at', now)
  end
else
  leave_queues(pending, KEYS[4], KEYS[5], ARGV[12], job_id)
  redis.call('HSET', job, 'ended_at', now)
  if ARGV[10] == '1' then
    redis.call('ZADD', errors, tonumber(now), job_id)
  end
end
if target == 'PENDING' then
  if live then
    redis.call('HINCRBY', KEYS[7], 'requeued', 1)
  end
elseif target == 'SUCCEEDED' or target == 'FAILED' or target == 'TIMEOUT' or target == 'CANCELLED' then
  local failure = ''
  if target == 'FAILED' or target == 'TIMEOUT' then
    failure = redis.call('HGET', job, 'failure') or ''
  end
  redis.call('HINCRBY', KEYS[7], 'ended:' .. target .. ':' .. failure, 1)
end
if ARGV[14] and ARGV[14] ~= '' then
  redis.call('PUBLISH', ARGV[14], job_id .. ' ' .. target)
end
if ARGV[15] and ARGV[15] ~= '' then
  local base = #KEYS - nwrite_keys
  for _, w in ipairs(cjson.decode(ARGV[15])) do
    local args = {}
    for i = 3, #w do
      if i - 2 <= w[2] then
        args[#args + 1] = KEYS[base + w[i]]
      else
        args[#args + 1] = w[i]
      end
    end
    if w[1] == 'bounded_runs' then
      bounded_runs(unpack(args))
    else
      redis.call(w[1], unpack(args))
    end
  end
end
return {1, state}
