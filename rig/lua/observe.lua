-- observe.lua: record one sample of a running job's measured GPU memory on one card, and make
-- the ledger count the larger of its declaration and what it really uses there.
--
-- KEYS[1]  card hash                        (rig:card:<node>:<index>)
-- KEYS[2]  the card's job reservations hash (rig:card:<node>:<index>:jobs)
-- KEYS[3]  job hash
-- ARGV[1]  job id
-- ARGV[2]  bytes the job's processes use on this card now
-- ARGV[3]  the card's utilisation now (percent, or '' if unknown)
-- ARGV[4]  bytes the job declared per card
-- ARGV[5]  tolerance: the job is "over its declaration" above declared * this (e.g. 1.05)
--
-- Returns {held bytes now, 1 if over its declaration else 0}; {-1, 0} when the job no longer
-- holds this card (it ended meanwhile): nothing is recorded then.

--#include lib_card

local held = redis.call('HGET', KEYS[2], ARGV[1])
if not held then
  return {-1, 0}
end
local observed, declared = tonumber(ARGV[2]), tonumber(ARGV[4])
local f = redis.call('HMGET', KEYS[3], 'vram_peak')
if observed > tonumber(f[1] or '0') then
  redis.call('HSET', KEYS[3], 'vram_peak', observed)
end
redis.call('HINCRBY', KEYS[3], 'vram_sum', observed)
redis.call('HINCRBY', KEYS[3], 'vram_samples', 1)
if ARGV[3] ~= '' then
  redis.call('HINCRBY', KEYS[3], 'util_sum', tonumber(ARGV[3]))
  redis.call('HINCRBY', KEYS[3], 'util_samples', 1)
end
local want = math.max(declared, observed)
local delta = want - tonumber(held)
if delta ~= 0 then
  redis.call('HSET', KEYS[2], ARGV[1], want)
  redis.call('HINCRBY', KEYS[1], 'reserved', delta)
  card_bump(KEYS[1])
end
local over = 0
if observed > declared * tonumber(ARGV[5]) then
  over = 1
  local prev = tonumber(redis.call('HGET', KEYS[3], 'overuse') or '0')
  if observed > prev then
    redis.call('HSET', KEYS[3], 'overuse', observed)
  end
end
return {want, over}
