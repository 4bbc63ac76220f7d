-- recount_card.lua: lib_card's card_recount for one card, from Python (rig.ledger.record_reading:
-- a card whose counters were edited by hand reads true again within one reading), moving the
-- card's version when it corrected them.
--
-- KEYS[1]  card hash                        (rig:card:<node>:<index>)
-- KEYS[2]  the card's job reservations hash (rig:card:<node>:<index>:jobs)
--
-- Returns 1 when the counters were corrected, else 0.

--#include lib_card

if card_recount(KEYS[1], KEYS[2]) then
  card_bump(KEYS[1])
  return 1
end
return 0
