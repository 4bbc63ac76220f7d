-- reserve.lua: move one PENDING job onto its card(s), reserving its VRAM, atomically.
--
-- KEYS[1]            job hash                      (rig:job:<id>)
-- KEYS[2]            pending zset                  (rig:pending)
-- KEYS[3]            state index PENDING           (rig:jobs:state:PENDING)
-- KEYS[4]            state index ASSIGNED          (rig:jobs:state:ASSIGNED)
-- KEYS[5]            the job's user's pending zset (rig:pending:user:<user>)
-- KEYS[6]            users with waiting jobs       (rig:pending:users)
-- KEYS[7 + 2i]       card hash of the i-th card    (rig:card:<node>:<index>)
-- KEYS[8 + 2i]       its job reservations hash     (rig:card:<node>:<index>:jobs)
-- KEYS[7 + 2n]       optional, right after the n card pairs (n = the length of ARGV[5]): the
--                    first card's start list (rig:card:<node>:<index>:starts), where
--                    '<id> <token>' is pushed on success: the reservation and its start are one
--                    step (its card worker takes it, workers/start_list.py)
-- ARGV[1]            job id
-- ARGV[2]            bytes to reserve on each card
-- ARGV[3]            now (epoch seconds)
-- ARGV[4]            node name
-- ARGV[5]            JSON list of the card indexes (same order as the card keys)
-- ARGV[6]            the job's user (member of KEYS[6])
-- ARGV[7]            optional: the events channel, where '<id> ASSIGNED' is published on success
--
-- Returns {1, token} on success (token = the job's new assignment number, which fences the
-- worker's claim), or {0, reason} and changes nothing.
--
-- Invariants kept, per card: reserved + foreign + bytes <= usable (foreign: memory used by
-- processes rig did not start); jobs + 1 <= max_jobs; only cards with allowed = 1 and
-- healthy = 1 and a valid record take jobs. The rule is lib_card's card_refusal (the mirror of
-- rig.models.CardState.refusal); a refusal is {0, 'card-<reason>:<card key>'}.

--#include lib_card
--#include lib_queue

local job, pending, idx_pending, idx_assigned = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job_id, bytes, now, node, cards = ARGV[1], tonumber(ARGV[2]), ARGV[3], ARGV[4], ARGV[5]

local jf = redis.call('HMGET', job, 'state', 'assignments', 'user')
local state = jf[1]
if state ~= 'PENDING' then
  return {0, 'state:' .. tostring(state)}
end
-- Checked before any write: Lua does not roll back, so a failure after the card writes
-- would leak the reservation.
if jf[2] and jf[2] ~= '' and not tonumber(jf[2]) then
  return {0, 'bad-record:assignments'}
end
-- The user names the per-user queue (KEYS[5]): a record whose user is not the caller's would
-- leave its id behind in another user's queue.
if (jf[3] or '?') ~= ARGV[6] and not (jf[3] == '' and ARGV[6] == '?') then
  return {0, 'bad-record:user'}
end

local ncards = #cjson.decode(cards)
local starts = KEYS[7 + 2 * ncards]  -- nil without a start list
for i = 0, ncards - 1 do
  local card = KEYS[7 + 2 * i]
  if card_recount(card, KEYS[8 + 2 * i]) then  -- counters edited by hand: its reservations count
    card_bump(card)
  end
  local refused = card_refusal(card, bytes)
  if refused then
    return {0, 'card-' .. refused .. ':' .. card}
  end
  if redis.call('HEXISTS', KEYS[8 + 2 * i], job_id) == 1 then
    return {0, 'already-reserved:' .. card}
  end
end

for i = 0, ncards - 1 do
  local card = KEYS[7 + 2 * i]
  for _, counter in ipairs({'reserved', 'jobs'}) do
    if redis.call('HGET', card, counter) == '' then  -- '' counts as 0 (card_refusal): HINCRBY would fail
      redis.call('HSET', card, counter, 0)
    end
  end
  redis.call('HINCRBY', card, 'reserved', bytes)
  redis.call('HINCRBY', card, 'jobs', 1)
  redis.call('HSET', KEYS[8 + 2 * i], job_id, bytes)
  card_bump(card)
end

local token = redis.call('HINCRBY', job, 'assignments', 1)
redis.call('HSET', job, 'state', 'ASSIGNED', 'node', node, 'cards', cards, 'assigned_at', now)
-- A reason explains the state it was written with ("requeued: ..."): placed again, it is stale.
redis.call('HDEL', job, 'wait_reason', 'reason')
redis.call('ZREM', idx_pending, job_id)
leave_queues(pending, KEYS[5], KEYS[6], ARGV[6], job_id)
redis.call('ZADD', idx_assigned, tonumber(job_id), job_id)
if starts then
  redis.call('RPUSH', starts, job_id .. ' ' .. token)
end
if ARGV[7] and ARGV[7] ~= '' then
  redis.call('PUBLISH', ARGV[7], job_id .. ' ASSIGNED')
end
return {1, token}
