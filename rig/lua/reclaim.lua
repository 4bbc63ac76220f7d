-- reclaim.lua: give back a card reservation whose job no longer holds it (a zombie).
--
-- A reservation is legitimate only while its job is ASSIGNED or RUNNING on that card. Anything
-- else (job ended, requeued, or its record is gone) is returned to the card, atomically with
-- that check, so a job that moves at the same instant is never robbed.
--
-- KEYS[1]  card hash
-- KEYS[2]  the card's job reservations hash
-- KEYS[3]  the job hash
-- ARGV[1]  job id
-- ARGV[2]  node name of the card
-- ARGV[3]  card index
--
-- Returns {1, bytes released} or {0, reason kept}.

--#include lib_card

local amount = redis.call('HGET', KEYS[2], ARGV[1])
if not amount then
  return {0, 'not-held'}
end
local f = redis.call('HMGET', KEYS[3], 'state', 'node', 'cards')
local state, node, cards = f[1], f[2], f[3]
if (state == 'ASSIGNED' or state == 'RUNNING') and node == ARGV[2] and cards then
  local ok, list = pcall(cjson.decode, cards)
  if not ok or type(list) ~= 'table' then
    return {0, 'undecodable-cards'}  -- a damaged live record: leave it to the job's own end
  end
  for _, idx in ipairs(list) do
    if tostring(idx) == ARGV[3] then
      return {0, 'held-by-live-job'}
    end
  end
end
redis.call('HDEL', KEYS[2], ARGV[1])
redis.call('HINCRBY', KEYS[1], 'reserved', -tonumber(amount))
redis.call('HINCRBY', KEYS[1], 'jobs', -1)
card_recount(KEYS[1], KEYS[2])
card_bump(KEYS[1])
return {1, amount}
