-- lib_runs.lua (a snippet scripts include by name): one value pushed onto a bounded map of short
-- lists (rig.bounded_runs: a user's run times per command or name, peaks per name), kept in one
-- hash so that a sweep of a million distinct commands or names leaves at most `fields_kept`
-- entries, not a million keys.
--
-- runs_hash  field (a command's digest, a name) -> values, newest first, space separated
-- seen_zset  field -> when it last ran (epoch s); the fields that ran longest ago leave both
--            keys once there are more than `fields_kept`
-- Both keys live `ttl` seconds after the last run. Returns the number of fields dropped.
local function bounded_runs(runs_hash, seen_zset, field, seconds, keep_runs, fields_kept, ended, ttl)
  local keep = tonumber(keep_runs)
  local runs = {seconds}
  local old = redis.call('HGET', runs_hash, field)
  if old then
    for value in string.gmatch(old, '%S+') do
      if #runs >= keep then break end
      runs[#runs + 1] = value
    end
  end
  redis.call('HSET', runs_hash, field, table.concat(runs, ' '))
  redis.call('ZADD', seen_zset, ended, field)
  local dropped = 0
  local extra = redis.call('ZCARD', seen_zset) - tonumber(fields_kept)
  if extra > 0 then
    local gone = redis.call('ZRANGE', seen_zset, 0, extra - 1)
    redis.call('HDEL', runs_hash, unpack(gone))
    redis.call('ZREMRANGEBYRANK', seen_zset, 0, extra - 1)
    dropped = #gone
  end
  redis.call('EXPIRE', runs_hash, ttl)
  redis.call('EXPIRE', seen_zset, ttl)
  return dropped
end
