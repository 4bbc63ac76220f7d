-- unqueue.lua: take a job that is no longer PENDING out of the waiting queues it was left in.
--
-- A waiting queue may keep an id whose record has moved on (a damaged record ended under a
-- fallback user name, a record deleted by hand): such ids would fill the dispatcher's look-ahead
-- for ever. Atomic with the state check, so a job requeued at the same instant keeps its place.
--
-- KEYS[1]  job hash
-- KEYS[2]  pending zset
-- KEYS[3]  the pending zset of the user whose queue held the id
-- KEYS[4]  users with waiting jobs (set)
-- ARGV[1]  job id
-- ARGV[2]  that user (member of KEYS[4])
--
-- Returns 1 when the id was taken out, 0 when the job is PENDING (left alone).

--#include lib_queue

if redis.call('HGET', KEYS[1], 'state') == 'PENDING' then
  return 0
end
leave_queues(KEYS[2], KEYS[3], KEYS[4], ARGV[2], ARGV[1])
return 1
