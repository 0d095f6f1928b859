"""The Kubernetes API client (lightkube; `pip install 'armature[kubernetes]'`, imported only
when a Kubernetes part is chosen), and one-line descriptions of its failures.

The cluster configuration is the Pod's service account when the process runs in a cluster
(its token re-read when the kubelet rotates it), else `$KUBECONFIG`, else `~/.kube/config`.
"""

from __future__ import annotations

import httpx2
import yaml
from lightkube import ApiError, AsyncClient, KubeConfig
from lightkube import ConfigError as KubeConfigError

from armature.errors import ConfigError

__all__ = ["TIMEOUT_S", "describe_api_failure", "get_credentials_source", "make_kube_client"]

TIMEOUT_S = 10.0  # per API call (a watch's stream has no read timeout)


def make_kube_client(*, namespace: str | None, field_manager: str, user: str) -> AsyncClient:
    """A client for the configured cluster; `namespace` None is the configuration's (the
    Pod's, or the context's). ConfigError, naming `user` (the flag that asked for
    Kubernetes), when there is no usable configuration."""
    try:
        config = KubeConfig.from_env()
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
    """Where the client's credentials come from, for error messages."""
    fname = client.config.fname
    return "the Pod's service account" if fname is None else str(fname)


def describe_api_failure(exc: httpx2.HTTPError) -> tuple[int | None, str]:
    """The HTTP status of a failed call (None: the server was not reached) and the server's
    message (or the transport's error)."""
    if isinstance(exc, ApiError):  # the server's Status (of an answer, or of a watch event)
        return exc.status.code, str(exc.status.message)
    if isinstance(exc, httpx2.HTTPStatusError):
        return exc.response.status_code, exc.response.reason_phrase
    return None, f"{type(exc).__name__}: {exc}"
