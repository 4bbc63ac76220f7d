-- lib_queue.lua (a snippet scripts include by name): a job leaving the waiting queues.
--
-- Take job_id out of `pending` (the global pending zset) and `user_queue` (its user's pending
-- zset); a user whose queue is now empty leaves `users` (the set of users with waiting jobs),
-- so fair share never visits them. Every script that takes a job out of waiting uses this.
local function leave_queues(pending, user_queue, users, user, job_id)
  redis.call('ZREM', pending, job_id)
  redis.call('ZREM', user_queue, job_id)
  if redis.call('ZCARD', user_queue) == 0 then
    redis.call('SREM', users, user)
  end
end
