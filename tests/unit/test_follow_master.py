"""rig.replication.follow_master after a write no replica confirmed: a master the sentinels
replaced is told apart even while redis-py's own look-up (SENTINEL MASTERS) still names it.

Just after a promotion only the leading sentinel knows the new master (GET-MASTER-ADDR-BY-NAME,
with a newer config epoch); every sentinel's SENTINEL MASTERS names the old one until the
fail-over ends. A master that was hung through it answers again as a master meanwhile: 12 of 15
submissions made then were acknowledged there (read back from it) and lost when it was demoted."""

from __future__ import annotations

import pytest
import redis

from rig import replication
from rig.replication import MasterDeposed, follow_master, newest_master

OLD, NEW = ("127.0.0.1", 7001), ("127.0.0.1", 7002)


class FakeSentinel:
    """A sentinel client: its view of the master (config epoch, address named), or an error."""

    def __init__(self, port: int, epoch: int = 0, named: tuple[str, int] = OLD, error: Exception | None = None):
        self.connection_pool = redis.ConnectionPool(host="127.0.0.1", port=port)
        self.epoch, self.named, self.error, self.asked = epoch, named, error, 0

    def pipeline(self, transaction: bool = True) -> FakeSentinel:
        return self

    def sentinel_master(self, name: str) -> None:
        pass

    def sentinel_get_master_addr_by_name(self, name: str) -> None:
        pass

    def execute(self) -> list[object]:
        self.asked += 1
        if self.error is not None:
            raise self.error
        # As redis-py gives them without decode_responses: the address's host in bytes.
        return [{"config-epoch": self.epoch}, (self.named[0].encode(), self.named[1])]


class FakePool:
    """redis-py's SentinelConnectionPool as follow_master sees it; its own look-up (SENTINEL
    MASTERS) names ``discovered``."""

    is_master = True
    service_name = "rigm"

    def __init__(self, sentinels: list[FakeSentinel], discovered: tuple[str, int] = OLD):
        self.master_address = OLD
        self.discovered = discovered
        self.sentinel_manager = type("Manager", (), {"sentinels": sentinels})()

    def get_master_address(self) -> tuple[str, int]:
        self.master_address = self.discovered
        return self.discovered


class FakeClient:
    def __init__(self, pool: FakePool):
        self.connection_pool = pool


@pytest.fixture(autouse=True)
def _no_quiet_sentinels(monkeypatch):
    monkeypatch.setattr(replication, "_quiet", {})


def test_a_master_only_the_leading_sentinel_knows_replaced_is_deposed():
    sentinels = [FakeSentinel(1, epoch=0), FakeSentinel(2, epoch=1, named=NEW), FakeSentinel(3, epoch=0)]
    with pytest.raises(MasterDeposed, match="127.0.0.1:7001 was replaced in a fail-over: the sentinels name "
                                            "127.0.0.1:7002"):
        follow_master(FakeClient(FakePool(sentinels)))


def test_the_master_every_sentinel_names_is_kept():
    sentinels = [FakeSentinel(1, epoch=3), FakeSentinel(2, epoch=3), FakeSentinel(3, epoch=2, named=NEW)]
    pool = FakePool(sentinels)
    follow_master(FakeClient(pool))  # an older epoch's view (a sentinel cut off for a while) is not followed
    assert pool.master_address == OLD


def test_a_pool_that_followed_the_new_master_before_the_write_is_not_deposed():
    # The write went to the new master; redis-py's look-up then names the old one (the leader's
    # SENTINEL MASTERS, until the fail-over ends): the write stands, the read-back says so.
    pool = FakePool([FakeSentinel(1, epoch=1, named=NEW)], discovered=OLD)
    pool.master_address = NEW
    follow_master(FakeClient(pool))


def test_sentinels_of_the_newest_epoch_that_disagree_tell_nothing():
    assert newest_master([FakeSentinel(1, epoch=2), FakeSentinel(2, epoch=2, named=NEW)], "rigm") is None


def test_a_silent_sentinel_is_left_out_for_a_while():
    hung = FakeSentinel(1, error=redis.TimeoutError("Timeout reading from socket"))
    live = FakeSentinel(2, epoch=1, named=NEW)
    assert newest_master([hung, live], "rigm") == NEW
    assert newest_master([hung, live], "rigm") == NEW
    assert (hung.asked, live.asked) == (1, 2)  # not its timeout again on the next unconfirmed write


def test_no_sentinel_answering_changes_nothing():
    down = FakeSentinel(1, error=redis.ConnectionError("Connection refused"))
    pool = FakePool([down])
    follow_master(FakeClient(pool))
    assert pool.master_address == OLD


def test_not_under_sentinel_nothing_is_asked():
    follow_master(redis.Redis(host="127.0.0.1", port=1))  # a plain pool: no sentinel, no connection
