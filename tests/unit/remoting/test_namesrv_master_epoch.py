"""Which registration holds brokerId 0 when two brokers claim it: a master registered at a newer
epoch keeps it against an older master (one that hung through a failover); otherwise, and for
brokers that send no epoch (Java's), the last registration wins as in RocketMQ."""

from __future__ import annotations

from rmqbroker.namesrv.routeinfo import RegisterResult, RouteInfoManager, TopicConfigLite

OLD, NEW = "127.0.0.1:10911", "127.0.0.1:10921"


def _register(routes: RouteInfoManager, addr: str, broker_id: int, epoch: int | None,
              connection_id: int = 1) -> RegisterResult:
    return routes.register_broker(cluster_name="C", broker_addr=addr, broker_name="b", broker_id=broker_id,
                                  ha_server_addr=addr.replace("109", "209"), data_version={"counter": 1},
                                  topics=[TopicConfigLite("T", 4, 4, 6)], connection_id=connection_id,
                                  epoch=epoch)


def _ids(routes: RouteInfoManager) -> dict[int, str]:
    return dict(routes.broker_addr_table["b"].broker_addrs)


def test_older_master_does_not_take_broker_id_0_from_a_newer_one() -> None:
    routes = RouteInfoManager()
    _register(routes, OLD, 0, 0)
    _register(routes, NEW, 0, 1)  # promoted at epoch 1 while the old master hung
    result = _register(routes, OLD, 0, 0)  # the old master runs again
    assert _ids(routes) == {0: NEW}
    assert OLD not in routes.broker_live_table
    assert result == RegisterResult("127.0.0.1:20921", NEW)  # it is told who the master is
    _register(routes, OLD, 1, 1)  # demoted: a slave of the new master
    assert _ids(routes) == {0: NEW, 1: OLD}


def test_same_epoch_new_address_or_no_epoch_takes_broker_id_0() -> None:
    routes = RouteInfoManager()
    _register(routes, OLD, 0, 3)
    _register(routes, NEW, 0, 3)  # the same master at a new address (a rescheduled pod)
    assert _ids(routes) == {0: NEW}
    _register(routes, OLD, 0, None)  # a Java broker: the last registration wins
    assert _ids(routes) == {0: OLD}
    _register(routes, NEW, 0, 0)  # the holder sent no epoch: nothing to compare
    assert _ids(routes) == {0: NEW}


def test_older_master_takes_broker_id_0_once_the_holder_is_gone() -> None:
    routes = RouteInfoManager()
    _register(routes, NEW, 0, 2, connection_id=7)
    routes.on_connection_closed(7)
    _register(routes, OLD, 0, 1)
    assert _ids(routes) == {0: OLD}
