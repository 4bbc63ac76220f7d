-- start_back.lua: put starts a card worker took but will not handle back at the head of the
-- card's start list (workers.start_list), each only if it is still in the taking list.
--
-- KEYS[1]  the card's start list   (rig:card:<node>:<index>:starts)
-- KEYS[2]  its taking list         (rig:card:<node>:<index>:taking)
-- ARGV     the entries ('<job id> <token>'), oldest first
--
-- Returns how many went back. An entry no longer in KEYS[2] (its worker removed it after the
-- claim, or another worker moved it back already) is not pushed: never a second copy from here.

local back = 0
for i = #ARGV, 1, -1 do
  if redis.call('LREM', KEYS[2], 1, ARGV[i]) == 1 then
    redis.call('LPUSH', KEYS[1], ARGV[i])
    back = back + 1
  end
end
return back
