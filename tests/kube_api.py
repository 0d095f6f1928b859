"""A fake Kubernetes API server speaking the real HTTP protocol (JSON over HTTP/1.1, bearer
tokens, `Status` objects on errors) on a free loopback port, for the planner's Kubernetes
connector; a real client (lightkube) talks to it through a generated kubeconfig.

    fake = KubeApiFake(token="t0k3n", namespace="serving", deployments={"armature-decode": 1})
    with fake:                                   # uvicorn in a thread, 127.0.0.1:<free port>
        fake.write_kubeconfig(tmp_path / "kubeconfig")
        ...
        fake.stop(); fake.start()                # down, and back on the same port
    fake.requests                                # every request, in order, with its answer

Each request goes through the steps of the real API server, in its order:
    1. authentication: no bearer token, or another one          -> 401 Unauthorized
    2. authorization: (verb, group, resource) not in `rules`      -> 403 Forbidden (RBAC)
    3. the handler of (group, resource) in `handlers`; none, or an unknown object -> 404
The verb follows Kubernetes' request info: GET of a name is `get`, of a collection `list`
(`watch` with ?watch=true), POST `create`, PUT `update`, PATCH `patch`, DELETE `delete`; the
resource of a subresource is "deployments/scale". Served now:
  - the Pods of `namespace` (`fake.pods`, tests/kube_pods.py): get, list, watch
    (resourceVersions, bookmarks, 410 on expiry), merge patch, which discovery needs (rules
    POD_RULES); and create, delete (finalizers) and pods/status patch (tests/kube_pod_writes.py);
  - namespaces (create, get, delete), their `default` service account, Deployments (create)
    and deployments/scale (get, and a merge or strategic merge patch of spec.replicas; the
    status follows at once), in tests/kube_workloads.py; `fake.deployments` holds the replicas.
Another resource is a rule and a handler; a watch handler returns a StreamingResponse of JSON
lines. SelfSubjectAccessReviews (POST .../authorization.k8s.io/v1/selfsubjectaccessreviews)
answer from `rules`, and any authenticated user may create one, as the real server's
system:basic-user role allows; `access_reviews=False` is a server without the API (404).

With `tls` (servers.TlsFiles: a CA and a server certificate for 127.0.0.1) it serves https
only, as a real API server does; `write_service_account` then writes what the kubelet mounts
in a Pod (token, namespace, ca.crt), for the in-cluster configuration, which finds the server
through $KUBERNETES_SERVICE_HOST and $KUBERNETES_SERVICE_PORT (`fake.port`). `token` may be
changed while serving (a rotated token: the old one is then refused).

`admin_token` is a second user, allowed everything (a cluster admin): a test sets its objects
up through the API with it (tests/kube_cluster_api.py), and `get_requests` leaves its requests
out, so that a test sees only those of the code under test. `create_namespace=False` starts
without `namespace`, for that admin to create.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kube_objects import status_response
from kube_pods import POD_RULES, POD_WATCH_RULES, PodStore
from kube_workloads import Workloads
from servers import TlsFiles

__all__ = [
    "POD_RULES",
    "POD_WATCH_RULES",
    "SCALE_RULES",
    "KubeApiFake",
    "KubeRequest",
    "RecordedRequest",
    "status_response",
]

# what the planner's service account may do (a Role's rules: verb, API group, resource)
SCALE_RULES = frozenset(
    {("get", "apps", "deployments/scale"), ("patch", "apps", "deployments/scale")}
)
_ACCESS_REVIEW = ("create", "authorization.k8s.io", "selfsubjectaccessreviews")
_METHODS = ["GET", "POST", "PUT", "PATCH", "DELETE"]


@dataclass(frozen=True)
class RecordedRequest:
    """One request as the fake saw it, and the status it answered."""

    method: str
    path: str
    query: str
    content_type: str | None
    authorization: str | None
    body: Any  # the decoded JSON body, or None
    status: int


@dataclass(frozen=True)
class KubeRequest:
    """A resource request, parsed as the API server's request info: `/api/v1/...` (group "")
    or `/apis/<group>/<version>/...`, then `namespaces/<ns>/` for a namespaced resource."""

    verb: str
    group: str
    version: str
    namespace: str | None
    resource: str  # with its subresource: "deployments/scale"
    name: str | None
    body: Any
    content_type: str | None
    query: dict[str, str] = field(default_factory=dict)


Handler = Callable[[KubeRequest], Response]


def parse_request_info(
    method: str, path: str, query: dict[str, str], body: Any, content_type: str | None
) -> KubeRequest:
    """The verb, group, version, namespace, resource and name of a resource path; ValueError
    for a path that names no resource (/version, /healthz, /apis)."""
    parts = [p for p in path.split("/") if p]
    if parts[:2] == ["api", "v1"]:
        group, version, rest = "", "v1", parts[2:]
    elif len(parts) >= 3 and parts[0] == "apis":
        group, version, rest = parts[1], parts[2], parts[3:]
    else:
        raise ValueError(path)
    namespace = None
    if len(rest) >= 3 and rest[0] == "namespaces":
        namespace, rest = rest[1], rest[2:]
    if not rest or len(rest) > 3:
        raise ValueError(path)
    resource = rest[0] if len(rest) < 3 else f"{rest[0]}/{rest[2]}"
    name = rest[1] if len(rest) >= 2 else None
    verbs = {"POST": "create", "PUT": "update", "PATCH": "patch"}
    if method == "GET":
        verb = "get" if name else ("watch" if query.get("watch") in ("1", "true") else "list")
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = verbs[method]
    return KubeRequest(verb, group, version, namespace, resource, name, body, content_type, query)


class KubeApiFake:
    """The fake's objects, rules and request log; serves them from a thread while started.
    Objects are read and changed only on the server's thread; `requests` is appended there
    and may be read from any thread (under `lock`)."""

    def __init__(
        self,
        *,
        token: str,
        namespace: str = "default",
        deployments: dict[str, int] | None = None,
        rules: frozenset[tuple[str, str, str]] = SCALE_RULES,
        user: str = "planner",
        access_reviews: bool = True,
        admin_token: str | None = None,
        create_namespace: bool = True,
        tls: TlsFiles | None = None,
    ) -> None:
        self.token = token
        self.tls = tls
        self.admin_token = admin_token
        self.access_reviews = access_reviews
        self.user = user  # the name in 403 messages and in the kubeconfig
        self.namespace = namespace
        self.rules = set(rules)
        self.pods = PodStore(namespace)
        self.workloads = Workloads(self.pods, [namespace] if create_namespace else [])
        # (namespace, name) -> the Deployment's replicas (the test may set them up here)
        self.deployments = self.workloads.deployments
        self.deployments.update(((namespace, n), r) for n, r in (deployments or {}).items())
        self.handlers: dict[tuple[str, str], Handler] = {
            ("", "namespaces"): self.workloads.handle_namespaces,
            ("", "serviceaccounts"): self.workloads.handle_service_accounts,
            ("", "pods"): self._pods,
            ("", "pods/status"): self.pods.handle,
            ("apps", "deployments"): self.workloads.handle_deployments,
            ("apps", "deployments/scale"): self.workloads.handle_scale,
        }
        self.requests: list[RecordedRequest] = []
        self.lock = threading.Lock()
        self.port = 0
        self._server: uvicorn.Server | None = None
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.app = Starlette(
            routes=[Route("/{path:path}", self._handle, methods=_METHODS)],
        )

    @property
    def url(self) -> str:
        scheme = "https" if self.tls is not None else "http"
        return f"{scheme}://127.0.0.1:{self.port}"

    def get_requests(self) -> list[RecordedRequest]:
        """Every request but the admin's (a test's own set-up), in order."""
        admin = f"Bearer {self.admin_token}" if self.admin_token else None
        with self.lock:
            return [r for r in self.requests if admin is None or r.authorization != admin]

    def write_kubeconfig(
        self, path: Path, *, token: str | None = None, namespace: str | None = None
    ) -> Path:
        """A kubeconfig whose current context is this server, `namespace` (default: the
        fake's) and the token (`token`: another one, to be refused, or the admin's). JSON,
        which is YAML."""
        cluster = {"server": self.url}
        if self.tls is not None:
            cluster["certificate-authority"] = str(self.tls.ca)
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "fake", "cluster": cluster}],
            "users": [{"name": self.user, "user": {"token": token or self.token}}],
            "contexts": [
                {
                    "name": "fake",
                    "context": {
                        "cluster": "fake",
                        "user": self.user,
                        "namespace": namespace or self.namespace,
                    },
                }
            ],
            "current-context": "fake",
        }
        path.write_text(json.dumps(config))
        return path

    def write_service_account(
        self, directory: Path, *, token: str | None = None, namespace: str | None = None
    ) -> Path:
        """A Pod's service-account directory, as the kubelet mounts it: `token` (default: the
        fake's), `namespace` (default: the fake's) and `ca.crt`, the CA of the fake's
        certificate (so it needs `tls`). Each file without a final newline, as Kubernetes
        writes them."""
        assert self.tls is not None, "an in-cluster configuration reaches the API over https"
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "token").write_text(token or self.token)
        (directory / "namespace").write_text(namespace or self.namespace)
        (directory / "ca.crt").write_bytes(self.tls.ca.read_bytes())
        return directory

    # -- serving ---------------------------------------------------------------------------

    def start(self) -> None:
        """Listen on 127.0.0.1 (the port of the last start, else a free one) and serve from a
        thread; connections queue from the moment this returns."""
        assert self._thread is None, "already started"
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", self.port))
        sock.listen(64)
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            access_log=False,
            log_level="warning",
            ssl_certfile=self.tls.server if self.tls is not None else None,
            ssl_keyfile=self.tls.server_key if self.tls is not None else None,
        )
        server = uvicorn.Server(config)
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="kube-api-fake", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop serving and close every connection (a client then sees connection refused);
        open watches end first. The objects stay, for the next start."""
        assert self._server is not None and self._thread is not None, "not started"
        self._stopping = True  # a watch reopened from here on is refused (503), not kept open
        self.pods.end_watches()
        self._server.should_exit = True
        self._thread.join(timeout=10.0)
        assert not self._thread.is_alive(), "the fake API server did not stop"
        self._server = None
        self._thread = None
        self._stopping = False

    def __enter__(self) -> KubeApiFake:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._thread is not None:
            self.stop()

    # -- requests --------------------------------------------------------------------------

    async def _handle(self, request: Request) -> Response:
        raw = await request.body()
        content_type = request.headers.get("content-type")
        authorization = request.headers.get("authorization")
        body: Any = None
        response: Response | None = None
        if raw:
            try:
                body = json.loads(raw)
            except ValueError:
                response = status_response(400, "BadRequest", "the body is not JSON")
        if response is None:
            response = self._answer(request, body, content_type, authorization)
        record = RecordedRequest(
            method=request.method,
            path=request.url.path,
            query=request.url.query,
            content_type=content_type,
            authorization=authorization,
            body=body,
            status=response.status_code,
        )
        with self.lock:
            self.requests.append(record)
        return response

    def _answer(
        self, request: Request, body: Any, content_type: str | None, authorization: str | None
    ) -> Response:
        if self._stopping:
            return status_response(503, "ServiceUnavailable", "the API server is shutting down")
        admin = self.admin_token is not None and authorization == f"Bearer {self.admin_token}"
        if authorization != f"Bearer {self.token}" and not admin:
            return status_response(401, "Unauthorized", "Unauthorized")
        query = dict(request.query_params)
        try:
            info = parse_request_info(request.method, request.url.path, query, body, content_type)
        except ValueError:
            return status_response(
                403,
                "Forbidden",
                f'forbidden: User "{self.user}" cannot {request.method} path "{request.url.path}"',
            )
        if (info.verb, info.group, info.resource) == _ACCESS_REVIEW:
            if not self.access_reviews:
                return status_response(404, "NotFound", "the server could not find the resource")
            return self._access_review(info)
        if not admin and (info.verb, info.group, info.resource) not in self.rules:
            where = f' in the namespace "{info.namespace}"' if info.namespace else ""
            return status_response(
                403,
                "Forbidden",
                f'{info.resource.split("/")[0]}.{info.group or "core"} "{info.name or ""}" is '
                f'forbidden: User "{self.user}" cannot {info.verb} resource "{info.resource}" '
                f'in API group "{info.group}"{where}',
                name=info.name or "",
                group=info.group,
                kind=info.resource.split("/")[0],
            )
        handler = self.handlers.get((info.group, info.resource))
        if handler is None:
            return status_response(
                404, "NotFound", "the server could not find the requested resource"
            )
        return handler(info)

    def _access_review(self, info: KubeRequest) -> Response:
        attributes = info.body["spec"]["resourceAttributes"]
        asked = (attributes["verb"], attributes.get("group", ""), attributes["resource"])
        allowed = asked in self.rules
        status: dict[str, Any] = {"allowed": allowed}
        if not allowed:
            status["reason"] = f'RBAC: User "{self.user}" has no rule for {asked[0]} {asked[2]}'
        review = {**info.body, "status": status}
        return JSONResponse(review, status_code=201)

    def _pods(self, info: KubeRequest) -> Response:
        if info.verb == "create":
            refused = self.workloads.check_may_create_in(info.namespace)
            if refused is not None:
                return refused
        return self.pods.handle(info)
