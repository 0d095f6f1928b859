"""The Kubernetes API client (lightkube; `pip install 'armature[kubernetes]'`, imported only
when a Kubernetes part is chosen), and one-line descriptions of its failures.

The cluster configuration is the Pod's service account when the process runs in a cluster
(`SERVICE_ACCOUNT_DIR`: its `token`, `namespace` and `ca.crt`, and the API server from
$KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT, over https), else `$KUBECONFIG`, else
`~/.kube/config`. lightkube 1.0.1 reads the token file at the client's first request and again
only when the API server answers 401, retrying that request once with what it read: a token
the kubelet rotated is picked up once the API server refuses the old one, not when the file
changes.
"""

from __future__ import annotations

from pathlib import Path

import httpx2
import yaml
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube import ConfigError as KubeConfigError
from lightkube.config.kubeconfig import SERVICE_ACCOUNT

from armature.errors import ConfigError

__all__ = [
    "SERVICE_ACCOUNT_DIR",
    "TIMEOUT_S",
    "describe_api_failure",
    "get_credentials_source",
    "make_kube_client",
]

TIMEOUT_S = 10.0  # per API call (a watch's stream: to connect and write; its reads: discovery's)
# where Kubernetes mounts a Pod's service account (lightkube's default)
SERVICE_ACCOUNT_DIR = Path(SERVICE_ACCOUNT)


def make_kube_client(
    *,
    namespace: str | None,
    field_manager: str,
    user: str,
    service_account_dir: Path = SERVICE_ACCOUNT_DIR,
) -> AsyncClient:
    """A client for the configured cluster: the service account in `service_account_dir`
    where it has a token, else the kubeconfig; `namespace` None is the configuration's (the
    service account's, or the context's). ConfigError, naming `user` (the flag that asked
    for Kubernetes), when there is no usable configuration."""
    try:
        config = KubeConfig.from_env(service_account=service_account_dir)
        return AsyncClient(
            config,
            namespace=namespace,
            field_manager=field_manager,
            timeout=httpx2.Timeout(TIMEOUT_S),
        )
    except (KubeConfigError, OSError, KeyError, ValueError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"{user}: no usable cluster configuration (not in a Pod, and $KUBECONFIG or "
            f"~/.kube/config unusable): {exc}"
        ) from None


def get_credentials_source(client: AsyncClient) -> str:
    """Where the client's credentials come from, for error messages: the kubeconfig file, or
    the service account's token file."""
    config = client.config
    if config.fname is not None:
        return str(config.fname)
    token_file = config.user.token_file if config.user is not None else None
    return f"the Pod's service account ({token_file})"


def describe_api_failure(exc: httpx2.HTTPError) -> tuple[int | None, str]:
    """The HTTP status of a failed call (None: the server was not reached) and the server's
    message (or the transport's error)."""
    if isinstance(exc, ApiError):  # the server's Status (of an answer, or of a watch event)
        return exc.status.code, str(exc.status.message)
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code, exc.response.reason_phrase
    return None, f"{type(exc).__name__}: {exc}"
