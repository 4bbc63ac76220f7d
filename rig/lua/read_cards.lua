-- read_cards.lua: the cards and their reservations, sending back only those whose version moved
-- since the caller read them (the dispatcher keeps both between passes: at 512 cards, reading
-- and parsing every one every pass was a third of an idle pass).
--
-- KEYS[2i - 1]  card hash i            (rig:card:<node>:<index>)
-- KEYS[2i]      its reservations hash  (rig:card:<node>:<index>:jobs)
-- ARGV[i]       the version of card i the caller holds ('' when none)
--
-- Returns one array per card, in KEYS order: {version} when the card's 'version' field is
-- ARGV[i], else {version ('' when unset), the card's flat field/value list (empty when
-- missing), its reservations' flat list}. Every writer of a card or its reservations bumps
-- 'version' in the same script or transaction (rig.ledger.CARD_VERSION), so an equal version
-- means both are as the caller read them; a card without one is always sent back.
local out = {}
for i = 1, #KEYS / 2 do
  local card = KEYS[2 * i - 1]
  local version = redis.call('HGET', card, 'version') or ''
  if version ~= '' and version == ARGV[i] then
    out[i] = {version}
  else
    out[i] = {version, redis.call('HGETALL', card), redis.call('HGETALL', KEYS[2 * i])}
  end
end
return out
