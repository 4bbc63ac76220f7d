-- bump_card.lua: lib_card's card_bump for the writers of a card record outside the ledger's
-- scripts (rig.ledger.bump_cards: registration, readings, health, draining), so the rule that
-- moves a card's version is written once.
--
-- KEYS[1 .. n]  card hashes (rig:card:<node>:<index>), each written just before, in the same
--               transaction
--
-- Returns the number of cards bumped.

--#include lib_card

for _, card in ipairs(KEYS) do
  card_bump(card)
end
return #KEYS
