"""``spark-submit --master k8s://`` for large groups: the driver and executors run as pods.

The verification job itself does not change: the same ``rmqbroker/verify/__main__.py`` runs as
the Spark driver (it sees ``PYSPARK_GATEWAY_PORT`` and keeps the submitted master) and the chunk
tasks run on the executors.  Only the admin endpoints of the brokers must be reachable from the
executor pods (cluster DNS names), and the token should come from a mounted Secret file.

Local mode in one Job pod (``rmq-verify`` alone) is the default; use this when a group's
commitlog is large enough that more cores than one pod's pay for the executors' start-up.
"""

from __future__ import annotations

from collections.abc import Sequence

# Where the image (Dockerfile: venv in /opt/rmq) has the job's main file.
IMAGE_MAIN = "local:///opt/rmq/lib/python3.11/site-packages/rmqbroker/verify/__main__.py"


def k8s_submit_args(
    *,
    api_server: str,
    image: str,
    namespace: str,
    replicas: Sequence[str],
    token_file: str,
    executors: int = 2,
    executor_cores: int = 2,
    executor_memory: str = "2g",
    service_account: str = "rmq-verify",
    app_name: str = "rmq-verify",
    job_args: Sequence[str] = (),
    main_file: str = IMAGE_MAIN,
    wait: bool = True,
    extra_conf: dict[str, str] | None = None,
) -> list[str]:
    """Arguments for ``spark-submit`` (without the program name) running the job in cluster mode."""
    conf = {
        "spark.kubernetes.container.image": image,
        "spark.kubernetes.namespace": namespace,
        "spark.kubernetes.authenticate.driver.serviceAccountName": service_account,
        "spark.executor.instances": str(executors),
        "spark.executor.cores": str(executor_cores),
        "spark.executor.memory": executor_memory,
        "spark.kubernetes.submission.waitAppCompletion": "true" if wait else "false",
        "spark.ui.enabled": "false",
        **(extra_conf or {}),
    }
    args = ["--master", f"k8s://{api_server}", "--deploy-mode", "cluster", "--name", app_name]
    for key, value in conf.items():
        args += ["--conf", f"{key}={value}"]
    args.append(main_file)
    args += ["--replicas", ",".join(replicas), "--token-file", token_file, *job_args]
    return args
