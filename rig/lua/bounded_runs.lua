-- bounded_runs.lua: one value pushed onto a bounded map of short lists (rig.bounded_runs): a user's
-- run times per command or per name (rig.estimates), peaks per name (--gpu-memory auto), kept in
-- one hash so that a sweep of a million distinct commands or names leaves at most ARGV[4]
-- entries, not a million keys.
--
-- KEYS[1] hash   field (a command's digest, a name) -> values, newest first, space separated
-- KEYS[2] zset   field -> when it last ran (epoch s); the fields that ran longest ago leave
--                both keys once there are more than ARGV[4]
-- ARGV[1] field
-- ARGV[2] the value (text, as it is stored)
-- ARGV[3] values kept per field
-- ARGV[4] fields kept
-- ARGV[5] when this value was measured (epoch s): the field's score
-- ARGV[6] seconds both keys live after the last push
-- Returns the number of fields dropped.
local keep = tonumber(ARGV[3])
local runs = {ARGV[2]}
local old = redis.call('HGET', KEYS[1], ARGV[1])
if old then
  for value in string.gmatch(old, '%S+') do
    if #runs >= keep then break end
    runs[#runs + 1] = value
  end
end
redis.call('HSET', KEYS[1], ARGV[1], table.concat(runs, ' '))
redis.call('ZADD', KEYS[2], ARGV[5], ARGV[1])
local dropped = 0
local extra = redis.call('ZCARD', KEYS[2]) - tonumber(ARGV[4])
if extra > 0 then
  local gone = redis.call('ZRANGE', KEYS[2], 0, extra - 1)
  redis.call('HDEL', KEYS[1], unpack(gone))
  redis.call('ZREMRANGEBYRANK', KEYS[2], 0, extra - 1)
  dropped = #gone
end
redis.call('EXPIRE', KEYS[1], ARGV[6])
redis.call('EXPIRE', KEYS[2], ARGV[6])
return dropped
