"""DELETE_TOPIC_IN_NAMESRV's route removal: everywhere, or only on one cluster's brokers (5.x's
clusterName), leaving other topics and clusters alone."""

from __future__ import annotations

from rmqbroker.namesrv.routeinfo import RouteInfoManager, TopicConfigLite


def _routes() -> RouteInfoManager:
    routes = RouteInfoManager()
    for cluster, broker, port in (("C1", "b1", 1), ("C1", "b2", 2), ("C2", "b3", 3)):
        routes.register_broker(cluster_name=cluster, broker_addr=f"127.0.0.1:{port}", broker_name=broker,
                               broker_id=0, ha_server_addr="", data_version={"counter": 1, "timestamp": 1},
                               topics=[TopicConfigLite("T", 4, 4, 6), TopicConfigLite("U", 4, 4, 6)],
                               connection_id=port)
    return routes


def test_delete_topic_everywhere() -> None:
    routes = _routes()
    routes.delete_topic("T")
    assert routes.pick_topic_route("T") is None
    assert set(routes.topic_queue_table["U"]) == {"b1", "b2", "b3"}
    routes.delete_topic("NoSuchTopic")  # not an error


def test_delete_topic_in_one_cluster() -> None:
    routes = _routes()
    routes.delete_topic("T", "C1")
    assert set(routes.topic_queue_table["T"]) == {"b3"}
    routes.delete_topic("T", "C2")
    assert "T" not in routes.topic_queue_table
    assert set(routes.topic_queue_table["U"]) == {"b1", "b2", "b3"}
