-- lib_card.lua (a snippet scripts include by name): may this card take a job now?
--
-- The mirror of rig.models.CardState.refusal, field by field (tests/store/test_card_rule.py
-- checks that both give the same answer over a table of records). Returns nil when the card
-- takes a job of `bytes` per card, else the reason word: 'missing' (no such card), 'invalid'
-- (a field it reads is missing or not a plain integer in range; allowed/healthy not '0'/'1'),
-- 'not-allowed', 'unhealthy', 'full' (reserved + foreign + bytes > usable), 'busy'
-- (jobs + 1 > max_jobs).
--
-- card_recount(card, holds): the card's 'reserved' and 'jobs' are the sum and the count of its
-- reservations hash (holds); every script keeps them so, and this puts them back when something
-- else changed them (an operator's HSET "freeing a leak"): reserve.lua before it checks a card,
-- the releases after they write, rig.ledger.record_reading at each reading. Returns true when it
-- corrected them. Garbage (not a plain integer) in a counter or a reservation is left alone:
-- card_refusal says 'invalid' for the first, and guessing over the second is not ours.
--
-- card_bump(card): every script that changes a card or its reservations calls it once per card
-- (rig.ledger.CARD_VERSION: the dispatcher re-reads only cards whose version moved). Never
-- raises, whatever the field holds (a script must not stop after its first write); a missing
-- card stays missing.

local CARD_MAX_BYTES = 17592186044416  -- rig.records.MAX_GPU_MEMORY (16 TiB)

-- A plain base-10 integer in [low, high]; `default` when the field is absent or empty
-- (nil default: the field is required). Returns nil for anything else.
local function card_int(text, low, high, default)
  if text == false or text == nil or text == '' then
    return default
  end
  if #text > 40 or not string.match(text, '^%-?%d+$') then
    return nil
  end
  local n = tonumber(text)
  if n == nil or n < low or n > high then
    return nil
  end
  return n
end

local function card_flag(text)
  if text == '1' then return true end
  if text == '0' then return false end
  return nil
end

local function card_refusal(card, bytes)
  local f = redis.call('HMGET', card, 'usable', 'reserved', 'foreign', 'jobs', 'max_jobs', 'allowed',
                       'healthy', 'total')
  if redis.call('EXISTS', card) == 0 then
    return 'missing'
  end
  local usable = card_int(f[1], 0, CARD_MAX_BYTES, nil)
  local reserved = card_int(f[2], -CARD_MAX_BYTES, CARD_MAX_BYTES, 0)
  local foreign = card_int(f[3], -CARD_MAX_BYTES, CARD_MAX_BYTES, 0)
  local jobs = card_int(f[4], -2147483648, 2147483648, 0)
  local max_jobs = card_int(f[5], 1, 1000000, 1)
  local allowed, healthy = card_flag(f[6]), card_flag(f[7])
  local total = card_int(f[8], 0, CARD_MAX_BYTES, nil)
  if usable == nil or reserved == nil or foreign == nil or jobs == nil or max_jobs == nil
      or allowed == nil or healthy == nil or total == nil then
    return 'invalid'
  end
  if not allowed then
    return 'not-allowed'
  end
  if not healthy then
    return 'unhealthy'
  end
  if reserved + foreign + bytes > usable then
    return 'full'
  end
  if jobs + 1 > max_jobs then
    return 'busy'
  end
  return nil
end

local function card_recount(card, holds)
  if redis.call('EXISTS', card) == 0 then
    return false
  end
  local f = redis.call('HMGET', card, 'reserved', 'jobs')
  local reserved = card_int(f[1], -CARD_MAX_BYTES, CARD_MAX_BYTES, 0)
  local jobs = card_int(f[2], -2147483648, 2147483648, 0)
  if reserved == nil or jobs == nil then
    return false
  end
  local sum, count = 0, 0
  for _, held in ipairs(redis.call('HVALS', holds)) do
    local n = card_int(held, 0, CARD_MAX_BYTES, nil)
    if n == nil then
      return false
    end
    sum, count = sum + n, count + 1
  end
  if sum == reserved and count == jobs then
    return false
  end
  redis.call('HSET', card, 'reserved', sum, 'jobs', count)
  return true
end

local function card_bump(card)
  if redis.call('EXISTS', card) == 1 then
    redis.call('HSET', card, 'version', (tonumber(redis.call('HGET', card, 'version')) or 0) + 1)
  end
end
